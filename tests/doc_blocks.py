"""The code blocks of the docs and the README, and how the tests run them.

A fenced block's info string says what the tests do with it (readers never see the words after
the language: MyST and GitHub highlight by the first word only):

* ````python```` — compiled, and type-checked by mypy (``--check-untyped-defs``) with the
  package's own types, so a renamed function, class or keyword fails.  Names the block does not
  define (``app``, ``run_on_gpu``, ...) are allowed: a block may be a fragment.
* ````python exec```` — also executed.  The ``exec`` blocks of one page run in order, in one
  namespace (like a doctest session: a later block may use the ``app`` of an earlier one), in a
  subprocess of their own, against the test Redis (``redis://localhost:6379/0`` in the text is
  replaced by its URL) under the test's key prefix.  ``exec raises=TypeError`` expects that
  exception; when the very next block is a ````text```` block, it must show the message
  (``<Type>: <message>``; hex addresses written as ``0x...``).
* ````python file=proj.py```` — a file of the quickstart, which
  ``tests/integration/test_quickstart.py`` writes out and runs with a real worker.

Execution isolation (see :func:`run_page`): Celery apps made by a block get the test's
``semaphore_key_prefix`` and a queue of its own, and ``Semaphore`` defaults to the test's prefix.
Blocks that set a key prefix themselves are not executed against Redis (the test refuses them).
"""

from __future__ import annotations

import json
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: the URL the docs use; replaced by the test Redis in executed blocks
DOC_REDIS_URL = "redis://localhost:6379/0"


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  #: 1-based line of the opening fence
    lang: str
    tags: dict[str, str] = field(default_factory=dict)
    source: str = ""

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return "exec" in self.tags

    @property
    def raises(self) -> str | None:
        return self.tags.get("raises")


def pages() -> list[Path]:
    """Every markdown page of the docs, and the README."""
    return [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of one markdown file, in order."""
    from markdown_it import MarkdownIt

    found = []
    for token in MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8")):
        if token.type != "fence" or token.map is None:
            continue
        words = token.info.split()
        lang = words[0] if words else ""
        tags: dict[str, str] = {}
        for word in words[1:]:
            key, _, value = word.partition("=")
            tags[key] = value
        found.append(Block(path, token.map[0] + 1, lang, tags, token.content))
    return found


def python_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p) if b.lang == "python"]


def shown_error(path: Path, block: Block) -> str | None:
    """The ``text`` block right after ``block`` (the message a ``raises=`` block shows)."""
    found = blocks(path)
    index = next(i for i, b in enumerate(found) if b.line == block.line)
    if index + 1 < len(found) and found[index + 1].lang == "text":
        return found[index + 1].source.strip()
    return None


def normalize_error(text: str) -> str:
    return re.sub(r"0x[0-9a-fA-F]+", "0x...", text).strip()


# -- executing one page's blocks (in a subprocess: see test_doc_code.py) ------------------------


def run_page(sources: list[str], redis_url: str, key_prefix: str) -> list[dict[str, Any]]:
    """Execute ``sources`` in order in one namespace, isolated as the module doc says.

    Returns one result per block: ``{"ok": True}`` or ``{"ok": False, "type": ...,
    "message": ..., "traceback": ...}``.  Call it only in a process of its own: it patches
    Celery and the package for the rest of the process.
    """
    import celery

    from celery_semaphore.core import base, semaphore

    # Semaphore(...) without key_prefix / redis: the test's prefix and Redis
    defaults = semaphore.Semaphore.__init__.__kwdefaults__
    if defaults is None:
        raise RuntimeError("Semaphore.__init__ has no keyword defaults to isolate")
    defaults["key_prefix"] = key_prefix
    semaphore.DEFAULT_URL = redis_url
    base.DEFAULT_URL = redis_url  # where Semaphore reads it (semaphore's is a re-export)

    # Celery(...) made by a block: the test's prefix, and a queue nobody else consumes
    original_init = celery.Celery.__init__

    def init(self: Any, *args: Any, changes: dict[str, Any] | None = None, **kw: Any) -> None:
        isolated = {
            **(changes or {}),
            "semaphore_key_prefix": key_prefix,
            "task_default_queue": f"{key_prefix}-queue",
        }
        original_init(self, *args, changes=isolated, **kw)

    celery.Celery.__init__ = init

    namespace: dict[str, Any] = {"__name__": "proj"}
    results: list[dict[str, Any]] = []
    for source in sources:
        code = compile(source.replace(DOC_REDIS_URL, redis_url), "<doc block>", "exec")
        try:
            exec(code, namespace)
        except Exception as exc:
            results.append(
                {
                    "ok": False,
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "traceback": traceback.format_exc(),
                }
            )
        else:
            results.append({"ok": True})
    return results


def main() -> None:
    """``python -m tests.doc_blocks`` reads ``{"sources", "redis_url", "key_prefix"}`` as JSON
    on stdin and prints the results of :func:`run_page` as JSON on the last line."""
    job = json.loads(sys.stdin.read())
    results = run_page(job["sources"], job["redis_url"], job["key_prefix"])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
