"""Stand-ins for the outside world: a payment gateway, an LLM API and a GPU box.

Each one sleeps for about as long as the real thing would take, and counts the calls it is
serving at once (:mod:`example_project.meter`), like a real gateway that rejects the 4th
concurrent call would.  Latencies are scaled by ``EXAMPLE_SPEED`` (2 = twice as fast).
"""

from __future__ import annotations

import os
import random
import time

from .meter import serving

SPEED = float(os.environ.get("EXAMPLE_SPEED", "1"))


def _work(seconds: float) -> None:
    time.sleep(seconds * random.uniform(0.7, 1.3) / SPEED)


class PaymentGateway:
    """Our contract allows 3 concurrent calls; the 4th would be refused with HTTP 429."""

    def charge(self, customer_id: str, amount_cents: int) -> str:
        with serving("payment-gateway"):
            _work(0.25)
        return f"ch_{customer_id}_{amount_cents}"


class LlmApi:
    """Each customer's API key allows 2 concurrent requests."""

    def summarize(self, customer_id: str, text: str) -> str:
        with serving(f"llm:{customer_id}"):
            _work(0.5)
        return text[:40]


class GpuBox:
    """4 GPUs; a full transcode takes 2 of them, a thumbnail 1."""

    def run(self, job: str, gpus: int, seconds: float) -> str:
        with serving("gpu", units=gpus):
            _work(seconds)
        return job


gateway = PaymentGateway()
llm = LlmApi()
gpus = GpuBox()
