"""The domain-event bus: where core's relay publishes and the notifier consumes.

In production the bus is RabbitMQ's durable topic exchange `settle.events`
(routing key = event type, persistent messages, publisher confirms); in the
embedded mode (`settle dev`) it is `InProcessBus`, which hands each event straight
to the notifier's handler. Both answer to `EventPublisher`, so the relay does not
know which one it drives.

A node lost, and a channel stuck on it: before a channel's first publish to a quorum
queue, RabbitMQ 3.10 (rabbit_fifo_client) asks the node the queue's record names as
leader. If that node is down (lost, its successor not yet elected and recorded: a
fraction of a second), the message is refused, and so is every later one on that
channel, each asking the dead node again, until that node is back: nacked under
publisher confirms, dropped without a word without them. A new channel reads the
record again. So a publisher that meets a nack drops its channel (`RabbitPublisher`,
the notifier's job broker). Seen in the chaos test: the relay reconnected to node 1
50 ms after node 0 stopped, 60 ms before the new leader, and every batch after was
nacked until node 0 came back.

`SETTLE_AMQP_PREFIX` puts a prefix in front of every exchange and queue name, so
test runs and benchmarks share a RabbitMQ without seeing each other's messages.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pika
import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel
from pika.adapters.select_connection import SelectConnection
from pika.channel import Channel

from shared import logs
from shared.settings import env_str, environ
from shared.topology import (
    DEAD_LETTER_EXCHANGE,
    EVENTS_EXCHANGE,
    NOTIFIER_DEAD_QUEUE,
    NOTIFIER_QUEUE,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class BusNames:
    """Exchange and queue names, all with the same prefix (empty in production)."""

    prefix: str = ""

    @property
    def exchange(self) -> str:
        return self.prefix + EVENTS_EXCHANGE

    @property
    def dead_letter_exchange(self) -> str:
        return self.prefix + DEAD_LETTER_EXCHANGE

    @property
    def notifier_queue(self) -> str:
        return self.prefix + NOTIFIER_QUEUE

    @property
    def notifier_dead_queue(self) -> str:
        return self.prefix + NOTIFIER_DEAD_QUEUE

    def queue(self, name: str) -> str:
        """Any other queue (the Dramatiq delivery queues), with the prefix."""
        return self.prefix + name

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BusNames:
        env = environ() if env is None else env
        return cls(env_str(env, "SETTLE_AMQP_PREFIX", "") or "")


class PublishError(RuntimeError):
    """The bus did not confirm every message; the unconfirmed ones must be published again.

    `confirmed` counts the messages, from the start of the batch, that the bus did
    confirm before the failure (they may be marked as published).
    """

    def __init__(self, message: str, *, confirmed: int = 0) -> None:
        super().__init__(message)
        self.confirmed = confirmed


@dataclass(frozen=True)
class OutgoingEvent:
    """One event as the relay hands it to the bus."""

    event_id: str
    event_type: str
    body: bytes
    #: The API request that caused it (sent as the AMQP correlation_id), if any.
    request_id: str | None = None


class EventPublisher(Protocol):
    """Publishes events and returns only once the bus has them for sure."""

    def publish_batch(self, batch: Sequence[OutgoingEvent]) -> None:
        """All confirmed on return; otherwise PublishError saying how many were, in order."""

    def keepalive(self) -> None:
        """Called while idle, so a connection can answer heartbeats."""

    def close(self) -> None: ...


def amqp_nodes(amqp_url: str) -> list[str]:
    """The node URLs of SETTLE_AMQP_URL, a RabbitMQ cluster's nodes separated by commas.

    Each item is a whole `amqp://` URL, or (after the first) `host[:port]` alone, which
    takes the first URL's user, password, vhost and options:
    `amqp://settle-core:pw@rabbit-1:5672/%2F,rabbit-2,rabbit-3:5673`.
    """
    items = [item.strip() for item in amqp_url.split(",") if item.strip()]
    if not items:
        return []
    first = urlsplit(items[0])
    nodes = [items[0]]
    for item in items[1:]:
        if "://" in item:
            nodes.append(item)
            continue
        credentials = first.netloc.rpartition("@")[0]
        netloc = f"{credentials}@{item}" if credentials else item
        nodes.append(urlunsplit((first.scheme, netloc, first.path, first.query, "")))
    return nodes


def node_parameters(amqp_url: str, *, timeout_s: float = 5.0) -> list[pika.URLParameters]:
    """Connection parameters of each node of SETTLE_AMQP_URL, one attempt each: a client
    that loses its node goes on to the next one instead of waiting on the dead one."""
    found = []
    for url in amqp_nodes(amqp_url):
        params = pika.URLParameters(url)
        params.socket_timeout = timeout_s
        params.connection_attempts = 1
        found.append(params)
    return found


def rotated(nodes: Sequence[T], start: int) -> list[T]:
    """`nodes` beginning at `start` (the node after the one that failed), wrapping round."""
    if not nodes:
        return []
    start %= len(nodes)
    return [*nodes[start:], *nodes[:start]]


def declare_events_exchange(channel: BlockingChannel, names: BusNames) -> None:
    channel.exchange_declare(names.exchange, exchange_type="topic", durable=True)


class RabbitPublisher:
    """Publishes to `settle.events` with publisher confirms, a whole batch per round trip.

    Built on pika's asynchronous `SelectConnection`, driven synchronously here: a
    batch is written at once, then the I/O loop runs until the broker has acked (or
    nacked, or returned) every message, so a batch costs one disk sync on the
    broker, not one per message. Messages are `mandatory`: while no queue is bound
    to the exchange (the notifier never ran) the broker returns them, and they count
    as not published, instead of being dropped. The connection opens on first use
    and again after any failure.
    """

    def __init__(
        self,
        amqp_url: str,
        names: BusNames | None = None,
        *,
        connect_timeout_s: float = 5.0,
        confirm_timeout_s: float = 15.0,
    ) -> None:
        self._names = names or BusNames()
        #: The cluster's nodes (SETTLE_AMQP_URL may list several); `_node` is the one in use,
        #: and a failure moves on to the next.
        self._nodes = node_parameters(amqp_url, timeout_s=connect_timeout_s)
        if not self._nodes:
            raise ValueError("an AMQP URL is required")
        self._node = 0
        for params in self._nodes:
            params.blocked_connection_timeout = 30
            params.client_properties = {
                "connection_name": f"settle outbox relay {self._names.prefix}".strip()
            }
        #: Stamped on every message as the AMQP `user_id`: RabbitMQ refuses a message whose
        #: user_id is not the connection's user, so the consumer can tell core's events
        #: from anyone else's (services/notifier/trust.py).
        self.user_id: str | None = getattr(self._nodes[0].credentials, "username", None)
        self._connect_timeout_s = connect_timeout_s
        self._confirm_timeout_s = confirm_timeout_s
        self._connection: SelectConnection | None = None
        self._channel: Channel | None = None
        self._ready = False
        self._failure: str | None = None
        #: Delivery tags of the batch in flight (confirm mode numbers them from 1).
        self._next_tag = 0
        self._outstanding: dict[int, int] = {}
        self._acked: set[int] = set()
        self._nacked: set[int] = set()
        self._returned: set[str] = set()
        #: What `_run_until` is waiting for (callbacks stop the loop when it holds).
        self._done: Callable[[], bool] | None = None

    # -- connection ----------------------------------------------------------------

    def _open(self) -> Channel:
        """The open channel, or a new one on the first node of the cluster that answers
        (from the one in use, which a failure has already moved past)."""
        if self._ready and self._channel is not None and self._channel.is_open:
            return self._channel
        failures = []
        for _ in self._nodes:
            params = self._nodes[self._node]
            self.close()
            self._failure = None
            self._connection = SelectConnection(
                params,
                on_open_callback=self._on_open,
                on_open_error_callback=self._on_open_error,
                on_close_callback=self._on_closed,
            )
            self._run_until(lambda: self._ready, self._connect_timeout_s)
            if self._ready:
                assert self._channel is not None
                return self._channel
            failures.append(f"{params.host}:{params.port}: {self._failure or 'timed out'}")
            self.close()
            self._next_node()
        raise PublishError(f"cannot reach RabbitMQ: {'; '.join(failures)}")

    def _next_node(self) -> None:
        self._node = (self._node + 1) % len(self._nodes)

    def _on_open(self, connection: SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, _connection: SelectConnection, error: BaseException | str) -> None:
        self._failure = repr(error)
        self._progress()

    def _on_closed(self, _connection: SelectConnection, reason: BaseException) -> None:
        self._failure = self._failure or f"connection closed: {reason!r}"
        self._ready = False
        self._progress()

    def _on_channel(self, channel: Channel) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=self._on_confirm_mode)

    def _on_channel_closed(self, _channel: Channel, reason: BaseException) -> None:
        self._failure = self._failure or f"channel closed: {reason!r}"
        self._ready = False
        self._progress()

    def _on_confirm_mode(self, _frame: pika.frame.Method) -> None:
        assert self._channel is not None
        self._next_tag = 0
        self._channel.exchange_declare(
            self._names.exchange,
            exchange_type="topic",
            durable=True,
            callback=lambda _frame: self._set_ready(),
        )

    def _set_ready(self) -> None:
        self._ready = True
        self._progress()

    def _run_until(self, done: Callable[[], bool], timeout: float) -> None:
        """Run the connection's I/O loop until `done()`, a failure, or the timeout."""
        assert self._connection is not None
        if done() or self._failure is not None:
            return
        ioloop = self._connection.ioloop
        self._done = done
        timer = ioloop.call_later(timeout, ioloop.stop)
        try:
            ioloop.start()
        finally:
            ioloop.remove_timeout(timer)
            self._done = None

    def _progress(self) -> None:
        """From a callback: stop the loop once what `_run_until` waits for has happened."""
        done, connection = self._done, self._connection
        if done is not None and connection is not None and (done() or self._failure is not None):
            connection.ioloop.stop()

    # -- confirms ------------------------------------------------------------------

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        settled = self._acked if isinstance(method, pika.spec.Basic.Ack) else self._nacked
        tag = method.delivery_tag
        tags = [t for t in self._outstanding if t <= tag] if method.multiple else [tag]
        for t in tags:
            if self._outstanding.pop(t, None) is not None:
                settled.add(t)
        self._progress()

    def _on_return(
        self,
        _channel: Channel,
        _method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        _body: bytes,
    ) -> None:
        self._returned.add(properties.message_id)

    def publish_batch(self, batch: Sequence[OutgoingEvent]) -> None:
        if not batch:
            return
        channel = self._open()
        self._outstanding.clear()
        self._acked.clear()
        self._nacked.clear()
        self._returned.clear()
        tags: list[int] = []
        try:
            for event in batch:
                channel.basic_publish(
                    exchange=self._names.exchange,
                    routing_key=event.event_type,
                    body=event.body,
                    properties=pika.BasicProperties(
                        delivery_mode=pika.DeliveryMode.Persistent,
                        content_type="application/json",
                        message_id=event.event_id,
                        correlation_id=event.request_id,
                        type=event.event_type,
                        user_id=self.user_id,
                    ),
                    mandatory=True,
                )
                self._next_tag += 1
                self._outstanding[self._next_tag] = len(tags)
                tags.append(self._next_tag)
        except (pika.exceptions.AMQPError, OSError) as err:
            self._failure = self._failure or repr(err)
        if self._failure is None:
            self._run_until(lambda: not self._outstanding, self._confirm_timeout_s)
        confirmed = 0
        for tag, event in zip(tags, batch, strict=False):
            if tag not in self._acked or event.event_id in self._returned:
                break
            confirmed += 1
        if confirmed == len(batch):
            return
        if self._returned:
            reason = f"no queue is bound to {self._names.exchange}: start `settle notifier consume`"
        elif self._nacked:
            reason = "RabbitMQ refused a message (nack)"
        else:
            reason = f"RabbitMQ did not confirm: {self._failure or 'timed out'}"
        if self._failure is not None or self._outstanding:
            # The connection is in an unknown state (its node may be gone): start over on
            # the next batch, on the next node. The unconfirmed events stay in the outbox.
            self.close()
            self._next_node()
        elif self._nacked:
            # A new channel for the next batch: a channel may go on refusing a quorum queue
            # for good (the module's docstring), a new one asks the current leader.
            self.close()
        raise PublishError(reason, confirmed=confirmed)

    def publish(self, event_id: str, event_type: str, body: bytes) -> None:
        """One event (a batch of one)."""
        self.publish_batch([OutgoingEvent(event_id, event_type, body)])

    def keepalive(self) -> None:
        """Answer heartbeats while idle (the relay calls this between batches)."""
        if self._connection is not None and self._ready:
            self._run_until(_never, 0.0)

    def close(self) -> None:
        connection, channel = self._connection, self._channel
        self._ready = False
        self._outstanding.clear()
        if connection is None:
            return
        if not (connection.is_closed or connection.is_closing):
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()
        # Let the close handshake run (bounded); the socket is dropped either way.
        self._failure = None
        self._run_until(lambda: connection.is_closed, 1.0)
        self._connection, self._channel = None, None
        del channel


def _never() -> bool:
    return False


#: What the in-process bus calls with each event's body (the notifier's handler).
EventHandler = Callable[[bytes], object]


class InProcessBus:
    """The embedded mode's bus: `publish` runs the notifier's handler at once.

    The handler stores the event and its deliveries and commits before it returns,
    which is what a broker's confirm promises; an exception means "not taken".
    """

    def __init__(self, handler: EventHandler) -> None:
        self._handler = handler

    def publish_batch(self, batch: Sequence[OutgoingEvent]) -> None:
        for index, event in enumerate(batch):
            try:
                # The handler reads the causing request's id as the consumer reads the
                # correlation_id: here, as the id of the "request" it is serving.
                with logs.request_scope(event.request_id):
                    self._handler(event.body)
            except Exception as err:
                raise PublishError(
                    f"in-process handler failed for {event.event_id}: {err!r}", confirmed=index
                ) from err

    def keepalive(self) -> None:
        return None

    def close(self) -> None:
        return None
