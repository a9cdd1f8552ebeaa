"""A small, realistic Celery project that uses celery-semaphore (see README.md)."""
