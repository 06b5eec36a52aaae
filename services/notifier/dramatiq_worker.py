"""Dramatiq's Worker with worker threads that sleep at rest.

Dramatiq's worker threads poll their work queue every `worker_timeout` to see whether
they should stop: the notifier's 16 threads at 250 ms woke 64 times a second with
nothing to do. Here they block on the queue until a job comes, and `stop()` wakes
them with one wake-up item each. The consumer threads keep Dramatiq's timeout: it is
also how soon a delayed message (a retry, a put-back delivery) is handed over once
due, and there are only four of them.
"""

from __future__ import annotations

from dramatiq import Worker
from dramatiq.common import iter_queue, join_all
from dramatiq.worker import WorkerThread, _WorkQueueItem

#: What `stop()` puts on the work queue for each thread: no message, ahead of any job.
_WAKE_PRIORITY = -(2**62)


class _BlockingWorkerThread(WorkerThread):  # type: ignore[misc]
    """A worker thread that waits for its next job without a timeout."""

    def run(self) -> None:
        self.running = True
        self.broker.emit_after("worker_thread_boot", self)
        while self.running:
            item = self.work_queue.get()
            if item.message is None:  # stop()'s wake-up: `running` is already False
                self.work_queue.task_done()
                continue
            self.process_message(item.message)
        self.broker.emit_before("worker_thread_shutdown", self)


class QuietWorker(Worker):  # type: ignore[misc]
    """`dramatiq.Worker` whose worker threads block on the work queue (see the module)."""

    def _add_worker(self) -> None:
        worker = _BlockingWorkerThread(
            broker=self.broker,
            consumers=self.consumers,
            work_queue=self.work_queue,
            worker_timeout=self.worker_timeout,
        )
        worker.start()
        self.workers.append(worker)

    def pause(self) -> None:
        raise NotImplementedError("the delivery worker does not pause; stop it instead")

    def stop(self, timeout: int = 600000) -> None:
        """Dramatiq's stop (jobs in hand finish, queued ones go back to the broker), with
        each idle worker thread woken first."""
        for thread in self.workers:
            thread.stop()
        for _ in self.workers:
            self.work_queue.put(_WorkQueueItem(_WAKE_PRIORITY, None))
        join_all(self.workers, timeout)
        # Wake-ups no thread took (it was busy, then saw `running` false) must not be
        # requeued as jobs: drop them, put the jobs back.
        taken = list(iter_queue(self.work_queue))
        for item in taken:
            self.work_queue.task_done()
            if item.message is not None:
                self.work_queue.put(item)
        super().stop(timeout)
