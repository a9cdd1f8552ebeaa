"""The gate's clocks: how long it holds a task and its place, and how often it looks.

Each is read as ``timing.NAME`` when it is used (so a test may change one for a while)."""

from __future__ import annotations

#: seconds a held task's place lives without a refresh (refreshed every third of it); shorter
#: with a shorter lease_ttl, so a dead node's held tasks block the line no longer than its
#: holders do, but never below HELD_PLACE_MIN
HELD_PLACE_TTL = 60.0
HELD_PLACE_MIN = 3.0
#: the longest a task is held before it is parked (re-published with a countdown); kept below
#: RabbitMQ's default consumer_timeout (30 min), and below half the Redis visibility_timeout
MAX_HOLD = 900.0
#: while Redis fails, a task held too long stays held up to this many times MAX_HOLD (still
#: below RabbitMQ's consumer_timeout and the Redis visibility_timeout), then parks regardless
PARK_ANYWAY = 1.5
#: seconds between the gate thread's maintenance passes
TICK = 1.0
#: a held task is named in wake-ups at most once per this many seconds
WAKE_GRACE = 1.0
#: the most wake-ups taken from the wake list in one go
WAKE_BATCH = 64
#: seconds between two looks at the pool children running gated bodies (prefork, Linux)
REAP_EVERY = 0.1
#: a child seen gone is given this long for its last result to reach the consumer before
#: the permit of the body it ran is released for it
DEAD_GRACE = 0.2
#: seconds the gate remembers a held task that left without a grant, in case a handoff for it
#: was already on its way: given back when the task was withdrawn, left to the pool copy that
#: carries the same claim when its place was handed over (slot, park)
LEFT_TTL = 2 * MAX_HOLD
