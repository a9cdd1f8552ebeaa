"""Which queue a task message was delivered from (the default partition of fair sharing).

A routing key is not a queue name: on RabbitMQ several queues may be bound with one key, or a
queue with a key unlike its name.  So, in the order of what is most exact:

1. the AMQP ``consumer_tag`` of the message, mapped to the queue the worker's task consumer
   subscribed with that tag (RabbitMQ; only the consumer's own process has both);
2. the message's exchange and routing key matched against the queues this worker consumes
   (``app.amqp.queues.consume_from``: the ``-Q`` selection), preferring a queue named like the
   routing key (the Redis transport, and a task body that did not come through the gate);
3. the routing key itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["delivery_queue"]


#: brokers whose message priority means "lower first" (kombu's Redis transport)
_LOWER_FIRST = frozenset({"redis", "rediss", "sentinel", "redis+socket"})


def message_priority(conf: Any, delivery_info: Mapping[str, Any] | None) -> int | None:
    """The limiter priority (0-9, higher first) of a message sent with
    ``apply_async(priority=N)``, or None when it has none.  RabbitMQ serves a higher N first,
    so N (at most 9) is used as it is; kombu's Redis transport serves a lower N first, so
    there it is 9 - N, and N = 0 counts as not given: that transport gives every message
    without a priority 0 (see docs/options.md)."""
    raw = (delivery_info or {}).get("priority")
    if isinstance(raw, bool) or not isinstance(raw, int):
        return None
    value = max(0, min(9, raw))
    scheme = str(conf.get("broker_url") or "").split("://", 1)[0].lower()
    if scheme not in _LOWER_FIRST:
        return value
    return None if value == 0 else 9 - value


def delivery_queue(
    app: Any, delivery_info: Mapping[str, Any] | None, consumer: Any = None
) -> str | None:
    """The name of the queue ``delivery_info`` came from, or None when it says nothing."""
    info = delivery_info or {}
    tag = info.get("consumer_tag")
    if tag and consumer is not None:
        task_consumer = getattr(consumer, "task_consumer", None)
        tags = getattr(task_consumer, "_active_tags", None) or {}
        for queue, active in list(tags.items()):
            if active == tag:
                return str(queue)
    routing_key = info.get("routing_key")
    exchange = info.get("exchange") or ""
    if not routing_key:
        return None
    matches = []
    for queue in _consumed(app):
        if exchange == "":  # the default exchange routes by queue name
            if queue.name == routing_key:
                return str(queue.name)
            continue
        bound_to = getattr(getattr(queue, "exchange", None), "name", None)
        if queue.routing_key == routing_key and bound_to == exchange:
            matches.append(str(queue.name))
    if routing_key in matches:
        return str(routing_key)
    return min(matches) if matches else str(routing_key)


def _consumed(app: Any) -> list[Any]:
    queues = app.amqp.queues
    try:
        return list(queues.consume_from.values())
    except AttributeError:
        return list(queues.values())
