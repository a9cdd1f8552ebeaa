"""``python -m example_project``: the demo (see :mod:`example_project.demo`)."""

from __future__ import annotations

import sys

from .demo import main

sys.exit(main())
