"""Sphinx configuration: MyST markdown pages plus autodoc of the public API.

Build with ``make docs`` (HTML in ``docs/_build/html``, warnings are errors, nitpicky).  The
build needs no Redis and no network: see ``_forbid_network`` below.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document the checkout, even when it is not installed


def _forbid_network() -> None:
    """Make any connection attempt during the build an error.

    Autodoc imports every documented module, the Celery layer included; none of them may need a
    Redis (or anything else) to be importable, since the docs are built where there is none.  A
    module that connected at import would fail here, and the build with it.
    """

    def refuse(self: socket.socket, address: Any) -> None:
        raise OSError(f"the docs build must not open network connections (to {address!r})")

    socket.socket.connect = refuse  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign,assignment]


_forbid_network()

from celery_semaphore import __version__  # noqa: E402  (after the path is set)

project = "celery-semaphore"
author = "celery-semaphore developers"
copyright = "celery-semaphore developers"
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# -- MyST -----------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
# `[text](page.md#some-heading)` links: anchors for headings down to ###
myst_heading_anchors = 3

# -- autodoc --------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_default_options = {"show-inheritance": True}

# -- cross-references -----------------------------------------------------------------------
# -n (nitpicky) reports every reference that does not resolve.  There is no intersphinx (the
# build is offline), so references into other projects' docs cannot resolve; they are listed
# here, everything else must.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:(class|exc|func|meth|obj|data|mod)", r"(redis|celery|kombu|subprocess)(\..*)?"),
    (r"py:(class|obj|data)", r"(collections\.abc|typing|types|contextlib|enum)\..*"),
    # short names used in signatures and docstrings of the package's internals
    (
        r"py:(class|obj)",
        r"(.*\.)?(LimitSpec|QueueOptions|AttemptOptions|GroupAttemptOptions|WakeHandler|LostCallback|_F|_T)",
    ),
    (r"py:mod", r"\.?keys"),
]

# -- HTML -----------------------------------------------------------------------------------
html_theme = "alabaster"
html_title = f"celery-semaphore {release}"
html_theme_options = {
    "description": "Fair, crash-safe concurrency limits for Celery tasks, on Redis.",
    "fixed_sidebar": True,
    "page_width": "1200px",
    "sidebar_width": "230px",
    "body_max_width": "none",  # the diagrams need about 90 columns
    "code_font_size": "0.8em",
}
html_static_path: list[str] = []
html_show_sourcelink = False
