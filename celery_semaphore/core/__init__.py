"""The core: a fair, weighted, lease-based semaphore in Redis, and groups of them.

No Celery here, and no application settings: everything takes a Redis client or URL.  Every
change to a semaphore's state is one Lua script (``scripts/``), run atomically on the Redis
server's clock; :mod:`._scripts` loads them, :mod:`.wire` packs their arguments and reads
their replies, and :mod:`.semaphore` (standing on :mod:`.base` and :mod:`.controls`) and
:mod:`.group` call them (one :class:`~.request.AcquireRequest` per attempt; the blocking wait
of both is :mod:`.waiting`).
"""
