"""The pages cannot drift from the code: every error and warning the package can produce is on
the troubleshooting page, every public name is in the API reference, the comparison quotes the
benchmarks page's measured figures, and the README's links lead somewhere."""

from __future__ import annotations

import ast
import re

import pytest

import celery_semaphore

from .doc_blocks import DOCS, ROOT

PACKAGE = ROOT / "celery_semaphore"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
LOG_LEVELS = {"warning", "error", "critical", "exception"}
#: raise sites a user cannot meet through the public API, with the reason
INTERNAL_RAISES = {
    ("__init__.py", "AttributeError"),  # the module's __getattr__: Python's own error
    ("pytest.py", "AttributeError"),  # the plugin module's __getattr__: the same
    ("_scripts.py", "ValueError"),  # an unknown script name: only the package names scripts
    ("logs.py", "ValueError"),  # an unknown concern: only the package names its loggers
}


def squash(text: str) -> str:
    """Whitespace-insensitive text (pages wrap lines; messages do not)."""
    return " ".join(text.split())


def literal_parts(node: ast.expr) -> list[str]:
    """The literal pieces of a message: a str, an f-string or a %-format, split at the values."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.split(r"%[-#0-9.]*[rsdifg]", node.value)
    if isinstance(node, ast.JoinedStr):
        parts, current = [], ""
        for value in node.values:
            if isinstance(value, ast.Constant):
                current += str(value.value)
            else:
                parts.append(current)
                current = ""
        return [*parts, current]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = literal_parts(node.left), literal_parts(node.right)
        if not left or not right:
            return left or right
        return [*left[:-1], left[-1] + right[0], *right[1:]]
    return []


def fragment(node: ast.expr) -> str | None:
    """The longest literal line of a message, trimmed: what a reader would search for."""
    lines = [line for part in literal_parts(node) for line in part.split("\n")]
    trimmed = [line.strip().strip(":;,.()'\"").strip() for line in lines]
    best = max(trimmed, key=len, default="")
    return best or None


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "?")


def _is_exception(name: str) -> bool:
    return name.endswith(("Error", "Timeout", "Exit", "Lost"))


def messages() -> list[tuple[str, str, str]]:
    """(where, kind, fragment) for every exception the package builds with a message (raised
    at once, or returned to be raised) and every log call at WARNING and above."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            kind = _name(node.func)
            if _is_exception(kind):
                if (path.name, kind) in INTERNAL_RAISES:
                    continue
            elif isinstance(node.func, ast.Attribute) and kind in LOG_LEVELS:
                kind = f"log.{kind}"
            else:
                continue
            text = fragment(node.args[0])
            if text is not None:
                found.append((f"{path.name}:{node.lineno}", kind, text))
    return found


MESSAGES = messages()


def test_the_package_has_messages_to_document() -> None:
    kinds = {kind for _, kind, _ in MESSAGES}
    assert len(MESSAGES) >= 40
    assert {"TypeError", "ValueError", "log.warning", "log.error"} <= kinds


def test_every_exported_exception_is_on_the_troubleshooting_page() -> None:
    text = TROUBLESHOOTING.read_text(encoding="utf-8")
    exported = [
        name
        for name in celery_semaphore.__all__
        if isinstance(obj := getattr(celery_semaphore, name), type)
        and issubclass(obj, BaseException)
    ]
    assert len(exported) >= 5
    missing = [name for name in exported if f"`{name}`" not in text]
    assert missing == [], f"exceptions missing from {TROUBLESHOOTING.name}"


@pytest.mark.parametrize(("where", "kind", "text"), MESSAGES, ids=[m[0] for m in MESSAGES])
def test_message_is_on_the_troubleshooting_page(where: str, kind: str, text: str) -> None:
    page = squash(TROUBLESHOOTING.read_text(encoding="utf-8"))
    assert squash(text) in page, (
        f"{where}: the {kind} message with {text!r} is not on {TROUBLESHOOTING.name}; "
        "add it with what it means and what to do"
    )


def test_every_public_name_is_in_the_api_reference() -> None:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"\.\. auto\w+:: celery_semaphore\.(\w+)", text))
    public = set(celery_semaphore.__all__) - {"__version__"}
    assert public - documented == set(), "public names missing from docs/api.md"


FIGURE = re.compile(r"\d+\.\d+|\d+(?:\.\d+)? ?ms\b|\d+ over-limit|\d+ ?%")


def test_comparison_quotes_only_measured_figures() -> None:
    """Every figure on the comparison page is one the benchmarks page (or the README)
    reports, from the benchmark scripts: none made up, none stale."""
    page = (DOCS / "comparison.md").read_text(encoding="utf-8")
    sources = squash(
        (ROOT / "README.md").read_text(encoding="utf-8")
        + (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    )
    figures = sorted(set(FIGURE.findall(squash(page))))
    assert len(figures) >= 10, figures
    unsourced = [f for f in figures if f not in sources]
    assert unsourced == [], "figures on docs/comparison.md that docs/benchmarks.md does not report"
    for script in ("benchmarks/primitive.py", "benchmarks/e2e.py"):
        assert script in page, f"the comparison must name its source, {script}"
        assert (ROOT / script).exists()


def test_readme_links_lead_to_files_and_headings() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+\.md)(?:#([\w-]+))?\)", readme)
    assert len(links) >= 5
    for target, anchor in links:
        path = ROOT / target
        assert path.exists(), f"README links to {target}, which does not exist"
        if anchor:
            headings = [
                re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                for line in path.read_text(encoding="utf-8").splitlines()
                if line.startswith("#")
            ]
            assert anchor in headings, f"README links to {target}#{anchor}: no such heading"


def test_every_page_is_in_the_index() -> None:
    """Sphinx warns about a page in no toctree too, but only when the docs are built."""
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^([a-z_-]+)$", index, flags=re.MULTILINE))
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    assert pages - listed == set()
