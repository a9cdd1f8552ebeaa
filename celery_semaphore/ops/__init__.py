"""Operations: the ``celery semaphore`` CLI, Prometheus metrics, the registry of semaphores in
use, views shared by both, the audit trail, and the testing helper.

Kept light to import: every ``celery`` command loads the CLI plugin (:mod:`.cli`).
"""
