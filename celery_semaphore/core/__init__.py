"""The core: a fair, weighted, lease-based semaphore in Redis, and groups of them.

No Celery here, and no application settings: everything takes a Redis client or URL.  Every
change to a semaphore's state is one Lua script (``scripts/``), run atomically on the Redis
server's clock; :mod:`._scripts` loads them and :mod:`.semaphore` and :mod:`.group` own the
Python side of their arguments and replies.
"""
