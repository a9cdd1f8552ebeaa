"""A small, realistic Celery project that uses celery-semaphore.

It charges customers through a payment gateway that allows 3 calls at once, summarizes their
documents with an LLM API that allows 2 requests at once per customer, and transcodes videos
on 4 GPUs.  The pieces:

* ``celeryconfig.py``: the settings (broker, queues and routes, ``semaphore_*``), from
  ``REDIS_URL`` and ``EXAMPLE_KEY_PREFIX`` in the environment;
* ``app.py``: the Celery app; ``tasks.py``: the tasks and their limits;
* ``services.py``: stand-ins for the gateway, the LLM API and the GPUs, which count the calls
  they serve at once (``meter.py``), independently of the semaphores;
* ``demo.py`` (``python -m example_project``, ``make demo``): starts a Redis and two workers,
  floods them, and checks the limits held; ``processes.py`` and ``plot.py`` (drawn with
  matplotlib, the ``demo`` extra) serve it.

Run it by hand like any Celery project::

    export REDIS_URL=redis://localhost:6379/0
    celery -A example_project.app worker -Q interactive,bulk -c 8 -P threads
    python -c 'from example_project.tasks import charge; charge.delay("cust-1", 1990)'
    celery -A example_project.app semaphore top
"""
