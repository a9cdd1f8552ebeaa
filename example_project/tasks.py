"""The project's tasks: what it does, and the limit each external service imposes.

* ``charge``: at most 3 calls to the payment gateway at once, from every worker together.
  Checkouts arrive on the ``interactive`` queue, the monthly billing run on ``bulk``; both
  share the gateway's 3 permits, fairly (waiters are served per queue), and ``bulk`` never
  holds more than 2 of them, so a checkout always finds a permit within one call's time.
* ``summarize``: each customer's LLM API key allows 2 requests at once: one semaphore per
  customer, named from the task's argument.
* ``transcode`` / ``thumbnail``: 4 GPU units; a transcode needs 2 of them, a thumbnail 1.
"""

from __future__ import annotations

from celery_semaphore import limited

from .app import app
from .services import gateway, gpus, llm


@app.task
@limited("payment-gateway", limit=3, queue_limits={"bulk": 2})
def charge(customer_id: str, amount_cents: int) -> str:
    return gateway.charge(customer_id, amount_cents)


@app.task
@limited("llm:{customer_id}", limit=2)
def summarize(customer_id: str, document_id: str) -> str:
    return llm.summarize(customer_id, f"document {document_id} of {customer_id}")


@app.task
@limited("gpu", limit=4, weight=2)
def transcode(video_id: str) -> str:
    return gpus.run(f"transcode {video_id}", gpus=2, seconds=1.0)


@app.task
@limited("gpu", limit=4, weight=1)
def thumbnail(video_id: str) -> str:
    return gpus.run(f"thumbnail {video_id}", gpus=1, seconds=0.3)
