"""Serving a WSGI app with gunicorn from our own command line."""

from __future__ import annotations

import multiprocessing
from typing import Any

from gunicorn.app.base import BaseApplication


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


def serve(target: str, *, host: str, port: int, workers: int, threads: int = 4) -> None:
    """Run gunicorn for `module:app` (blocks until stopped)."""
    _Gunicorn(
        target,
        {
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
        },
    ).run()
