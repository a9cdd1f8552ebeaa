"""The project's tasks: what it does, and the limit each external service imposes.

* ``charge``: at most 3 calls to the payment gateway at once, from every worker together.
  Checkouts arrive on the ``interactive`` queue, the monthly billing run on ``bulk``; both
  share the gateway's 3 permits.
* ``transcode`` / ``thumbnail``: 4 GPU units; a transcode needs 2 of them, a thumbnail 1.
"""

from __future__ import annotations

from celery_semaphore import limited

from .app import app
from .services import gateway, gpus


@app.task
@limited("payment-gateway", limit=3)
def charge(customer_id: str, amount_cents: int) -> str:
    return gateway.charge(customer_id, amount_cents)


@app.task
@limited("gpu", limit=4, weight=2)
def transcode(video_id: str) -> str:
    return gpus.run(f"transcode {video_id}", gpus=2, seconds=1.0)


@app.task
@limited("gpu", limit=4, weight=1)
def thumbnail(video_id: str) -> str:
    return gpus.run(f"thumbnail {video_id}", gpus=1, seconds=0.3)
