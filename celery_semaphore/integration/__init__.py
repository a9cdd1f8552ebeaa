"""The Celery layer: ``@limited`` and ``LimitedTask``, the worker's gate, the wrapper around a
task's body, lease heartbeats, settings and worker signals.

It builds on :mod:`celery_semaphore.core` only; it reaches the ops layer through events
(:mod:`.events`) and the worker-start hooks of :mod:`.signals`, never by importing it.
"""
