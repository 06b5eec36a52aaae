"""Serving a WSGI app with gunicorn from our own command line.

Production defaults (`settle core api`, `settle notifier api`): one worker process
per core (at least two, so one can restart while the other serves) and 4 threads
each (gthread). A request spends much of its life waiting on PostgreSQL, above all
on the WAL flush of its commit; with threads, other requests of the same process
run meanwhile, and concurrent commits share one flush (PostgreSQL's group commit).
More threads than that buy little on CPU-bound Python (one GIL per process) and
cost latency; docs/PERFORMANCE.md has the measurements.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from gunicorn.app.base import BaseApplication

from shared.heap import freeze_heap

#: Threads per worker process unless the command line says otherwise.
DEFAULT_THREADS = 4


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, target: str, options: dict[str, Any]) -> None:
        self._target = target
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from gunicorn.util import import_app

        return import_app(self._target)


def default_workers() -> int:
    return max(2, multiprocessing.cpu_count())


def serve(
    target: str, *, host: str, port: int, workers: int, threads: int = DEFAULT_THREADS
) -> None:
    """Run gunicorn for `module:app` (blocks until stopped)."""
    options = {
        "bind": f"{host}:{port}",
        "workers": workers,
        "threads": threads,
        "worker_class": "gthread" if threads > 1 else "sync",
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
        "keepalive": 30,
        "graceful_timeout": 20,
        "timeout": 60,
        "post_worker_init": _freeze_heap,
    }
    _Gunicorn(target, options).run()


def _freeze_heap(worker: Any) -> None:
    """`freeze_heap` in each gunicorn worker, once its app is built."""
    freeze_heap()
