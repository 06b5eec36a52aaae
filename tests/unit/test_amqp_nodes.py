"""SETTLE_AMQP_URL as a RabbitMQ cluster's nodes, separated by commas."""

from __future__ import annotations

from shared.bus import amqp_nodes, node_parameters, rotated


def test_one_url_is_one_node() -> None:
    assert amqp_nodes("amqp://u:p@rabbit:5672/%2F") == ["amqp://u:p@rabbit:5672/%2F"]


def test_later_nodes_may_name_only_their_host_and_take_the_rest_from_the_first() -> None:
    nodes = amqp_nodes("amqp://u:p@a:5672/%2F?heartbeat=30, b ,c:5673,amqps://v:q@d:5671/x")
    assert nodes == [
        "amqp://u:p@a:5672/%2F?heartbeat=30",
        "amqp://u:p@b/%2F?heartbeat=30",
        "amqp://u:p@c:5673/%2F?heartbeat=30",
        "amqps://v:q@d:5671/x",
    ]
    params = node_parameters(",".join(nodes[:3]))
    assert [(p.host, p.port, p.credentials.username) for p in params] == [
        ("a", 5672, "u"),
        ("b", 5672, "u"),
        ("c", 5673, "u"),
    ]
    # One attempt each: a dead node sends the client on to the next at once
    assert {p.connection_attempts for p in params} == {1}


def test_nothing_is_no_node_and_rotation_wraps() -> None:
    assert amqp_nodes(" , ") == []
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert rotated([], 1) == []
