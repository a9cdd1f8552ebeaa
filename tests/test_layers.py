"""The package's three layers, checked from the source: core (Redis and Lua, no Celery) ->
integration (the Celery layer) -> ops (CLI, metrics, registry).  A module imports only from its
own layer and the layers below it (``logs`` is below all three; the package's ``__init__``
stands above them), the core never imports Celery or kombu, and no imports form a cycle: an
import inside a function (made late, to keep a module light or to dodge a cycle) is an edge
like any other, for the layers and for the cycles."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "celery_semaphore"
#: what each layer may import from the package (besides itself)
ALLOWED = {
    "logs": set(),
    "core": {"logs"},
    "integration": {"logs", "core"},
    "ops": {"logs", "core", "integration"},
    "top": {"logs", "core", "integration", "ops"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "top"
    if parts[1] in ("core", "integration", "ops"):
        return parts[1]
    if parts[1] == "logs":
        return "logs"
    return "top"


#: where an import statement is: at module level (``top``, directly in the module's body),
#: anywhere else that runs (``nested``: in a function, a class, a ``try``), or only for the
#: type checker (``typing``: under ``if TYPE_CHECKING:``, never executed)
Where = Literal["top", "nested", "typing"]


def _imports(path: Path) -> Iterator[tuple[str, Where]]:
    """(imported module, where) for every import in ``path``."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _imports_in(ast.parse(path.read_text(), str(path)), package)


def _imports_in(tree: ast.Module, package: str) -> Iterator[tuple[str, Where]]:
    top_level = {id(node) for node in tree.body}
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        where: Where = "top" if id(node) in top_level else "nested"
        if id(node) in typing_only:
            where = "typing"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, where
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            yield source, where
            for alias in node.names:  # `from . import config` imports a module too
                yield f"{source}.{alias.name}", where


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _internal(name: str, modules: dict[str, Path]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def test_the_layers_are_where_the_package_says() -> None:
    layers = {_layer(m) for m in _modules()}
    assert layers == {"top", "logs", "core", "integration", "ops"}


def test_each_layer_imports_only_the_layers_below_it() -> None:
    modules = _modules()
    wrong = []
    for module, path in sorted(modules.items()):
        mine = _layer(module)
        for name, _ in _imports(path):
            target = _internal(name, modules)
            if target is None or (target == "celery_semaphore" and name == "celery_semaphore"):
                continue
            theirs = _layer(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(wrong)


def test_the_pytest_plugin_module_is_a_thin_top_level_name() -> None:
    """``celery_semaphore.pytest`` (the name pytest loads) stands above the layers and only
    re-exports the ops layer's plugin: its code lives in ``ops``, so the rule "ops may import
    integration and core, never the reverse" covers it, and nothing below imports it."""
    modules = _modules()
    assert _layer("celery_semaphore.pytest") == "top"
    imported = {name for name, _ in _imports(modules["celery_semaphore.pytest"])}
    ours = {_internal(n, modules) for n in imported} - {None}
    assert ours, imported
    assert all(_layer(str(m)) == "ops" for m in ours), ours
    assert imported - {n for n in imported if _internal(n, modules)} <= {
        "__future__",
        "__future__.annotations",
        "typing",
        "typing.TYPE_CHECKING",
        "typing.Any",
    }
    users = [
        module
        for module, path in modules.items()
        if module != "celery_semaphore.pytest"
        for name, _ in _imports(path)
        if _internal(name, modules) == "celery_semaphore.pytest"
    ]
    assert users == []


def test_the_core_never_imports_celery_or_kombu() -> None:
    found = [
        f"{module} imports {name}"
        for module, path in _modules().items()
        if _layer(module) in ("core", "logs")
        for name, _ in _imports(path)
        if name.split(".")[0] in ("celery", "kombu", "billiard")
    ]
    assert not found, found


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Which package modules each module imports when it runs: at module level or inside a
    function alike.  Imports under ``if TYPE_CHECKING:`` are left out: they never run (they
    exist so that annotations may name a module that imports this one)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for name, where in _imports(path):
            target = _internal(name, modules)
            if where != "typing" and target is not None and target != module:
                graph[module].add(target)
    # a package's __init__ importing its own submodules is not a cycle in Python's sense
    for module in modules:
        graph[module] = {t for t in graph[module] if not module.startswith(t + ".")}
    return graph


def test_imports_form_no_cycle() -> None:
    cycle = _find_cycle(_graph(_modules()))
    assert cycle is None, " -> ".join(cycle or [])


def test_an_import_inside_a_function_is_an_edge() -> None:
    """The check sees imports wherever they are, and tells the type checker's apart."""
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from . import a\n"
        "try:\n    from . import b\nexcept ImportError:\n    pass\n"
        "if TYPE_CHECKING:\n    from .c import C\n"
        "def f():\n    from .d import g\n    import celery_semaphore.e\n"
    )
    found = dict(_imports_in(tree, "celery_semaphore.ops"))
    assert found["celery_semaphore.ops.a"] == "top"
    assert found["celery_semaphore.ops.b"] == "nested"
    assert found["celery_semaphore.ops.c"] == "typing"
    assert found["celery_semaphore.ops.d"] == "nested"
    assert found["celery_semaphore.e"] == "nested"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


@pytest.mark.parametrize(
    ("graph", "cyclic"),
    [({"a": {"b"}, "b": {"a"}}, True), ({"a": {"b"}, "b": set()}, False)],
)
def test_the_cycle_check_can_fail(graph: dict[str, set[str]], cyclic: bool) -> None:
    assert (_find_cycle(graph) is not None) is cyclic
