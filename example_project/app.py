"""The Celery app: ``celery -A example_project.app worker -Q interactive,bulk``."""

from __future__ import annotations

from celery import Celery

app = Celery("example_project", include=["example_project.tasks"])
app.config_from_object("example_project.celeryconfig")
