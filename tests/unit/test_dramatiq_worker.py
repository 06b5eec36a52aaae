"""The delivery worker's threads at rest: blocked on their queue, woken to stop."""

from __future__ import annotations

import threading
import time
from queue import Empty, PriorityQueue
from typing import Any

import dramatiq
from dramatiq.brokers.stub import StubBroker

from services.notifier.dramatiq_worker import QuietWorker


class CountingQueue(PriorityQueue):  # type: ignore[type-arg]
    """A work queue that counts the gets that came back empty (a thread's poll)."""

    def __init__(self) -> None:
        super().__init__()
        self.empty_gets = 0

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        try:
            return super().get(block, timeout)
        except Empty:
            if block:
                self.empty_gets += 1
            raise


def test_idle_threads_wait_for_work_and_stop_when_asked() -> None:
    broker = StubBroker()
    done = threading.Event()

    @dramatiq.actor(broker=broker, queue_name="jobs")
    def job() -> None:
        done.set()

    # Given a worker of 8 threads whose consumers poll every 100 ms
    worker = QuietWorker(broker, worker_threads=8, worker_timeout=100)
    queue = CountingQueue()
    worker.work_queue = queue
    worker.start()
    try:
        # When a job comes, it runs
        job.send()
        assert done.wait(5)
        # And for a second nothing comes
        time.sleep(1.0)
    finally:
        # When the worker is stopped
        worker.stop(timeout=5000)
    # Then no worker thread woke up to find its queue empty (Dramatiq's threads poll
    # every worker_timeout: 8 threads, 10 times a second)
    assert queue.empty_gets == 0
    # And every thread has ended: the idle ones were woken to stop
    assert not any(thread.is_alive() for thread in worker.workers)
    # And no wake-up was left behind as a job
    assert queue.qsize() == 0


def test_a_job_waiting_when_the_worker_stops_goes_back_to_its_queue() -> None:
    broker = StubBroker()
    started, release = threading.Event(), threading.Event()

    @dramatiq.actor(broker=broker, queue_name="jobs")
    def slow() -> None:
        started.set()
        release.wait(5)

    # Given a worker of one thread busy with a job, and a second job waiting for it
    worker = QuietWorker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    requeued: list[Any] = []
    consumer = worker.consumers["jobs"]
    consumer.requeue_messages = lambda messages: requeued.extend(messages)
    slow.send()
    assert started.wait(5)
    slow.send()
    deadline = time.monotonic() + 5
    while worker.work_queue.qsize() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    # When it is stopped while the first job runs
    stopper = threading.Thread(target=worker.stop, kwargs={"timeout": 5000})
    stopper.start()
    time.sleep(0.2)
    release.set()
    stopper.join(10)
    # Then the waiting job goes back to the broker (not lost), and nothing else does
    assert not stopper.is_alive()
    assert [message.actor_name for message in requeued] == ["slow"]
