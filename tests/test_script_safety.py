"""Static checks that user data can never become code or another key: the Lua scripts take it
only as ARGV and build no key names, the Python side never formats anything into script text,
and nothing the package stores or reads is unpickled."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from celery_semaphore.core import _scripts

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "celery_semaphore"
SCRIPTS = sorted((PACKAGE / "core" / "scripts").glob("*.lua"))

CALL = re.compile(r"redis\.p?call\(\s*([^,)]*)\s*(?:,\s*([^,)]*))?")
KEYLESS = {"TIME"}
#: a key argument: KEYS[...] itself, or a variable (checked below to come from KEYS)
KEY_ARG = re.compile(r"^(KEYS\[[^\]'\".]+\]|[A-Za-z_]\w*(\[[A-Za-z_0-9+\- ]+\])?)$")


def _code(text: str) -> str:
    """The script without comments (``--`` to the end of the line)."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) >= 7
    assert {p.stem for p in SCRIPTS} >= {"_lib", *_scripts.OPERATIONS}


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_lua_builds_no_code_and_no_key_names(path: Path) -> None:
    code = _code(path.read_text(encoding="utf-8"))
    # nothing turns data into code, and no script runs another
    for forbidden in ("loadstring", "load(", "dofile", "loadfile", "setfenv", "'EVAL", '"EVAL'):
        assert forbidden not in code, f"{path.name}: {forbidden}"
    all_code = "\n".join(_code(p.read_text(encoding="utf-8")) for p in SCRIPTS)
    key_vars = set(re.findall(r"local\s+([\w\s,]+?)\s*=\s*KEYS\[", all_code))
    names = {n.strip() for group in key_vars for n in group.split(",")}
    calls = CALL.findall(code)
    for command, key in calls:
        # the command is a literal: data never picks what runs
        assert re.fullmatch(r"'[A-Z]+'", command.strip()), f"{path.name}: command {command!r}"
        if command.strip("'") in KEYLESS:
            continue
        key = key.strip()
        assert KEY_ARG.match(key), f"{path.name}: key argument {key!r} is built, not from KEYS"
        base = key.split("[", 1)[0]
        assert base == "KEYS" or base in names, (
            f"{path.name}: key argument {key!r} is not a variable assigned from KEYS ({names})"
        )


def test_script_text_is_exactly_the_package_files() -> None:
    pkg = PACKAGE / "core" / "scripts"
    prelude = (pkg / "_lib.lua").read_text(encoding="utf-8")
    for op in _scripts.OPERATIONS:
        body = (pkg / f"{op}.lua").read_text(encoding="utf-8")
        assert _scripts.source(op) == f"{prelude}\n{body}"


SCRIPT_CALLS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "register_script", "script_load"}


def _script_call_sites() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name = node.func.attr
            if name in SCRIPT_CALLS:
                found.append((path.name, node.lineno, ast.unparse(node)))
            elif name == "execute_command" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and str(first.value).upper().startswith(
                    ("EVAL", "SCRIPT", "FUNCTION", "FCALL")
                ):
                    found.append((path.name, node.lineno, ast.unparse(node)))
    return found


def test_only_the_script_loader_sends_scripts_and_only_file_text() -> None:
    sites = _script_call_sites()
    assert sites, "expected the script loader's calls"
    # the one other site: the pytest plugin's recorder counts bodies with a script of its
    # own (no semaphore state), registered from a module constant, never formatted text
    recorder = [call for where, _, call in sites if where == "recording.py"]
    assert recorder == ["client.register_script(_RECORD)"], recorder
    sites = [site for site in sites if site[0] != "recording.py"]
    assert {where for where, _, _ in sites} == {"_scripts.py"}, sites
    for _, line, call in sites:
        # the text sent is the loader's own (source() of a package file, or the Script object
        # made from it), never something formatted here
        for formatting in ("f'", 'f"', ".format(", " % ", " + "):
            assert formatting not in call, (line, call)
    # and the loader registers source(op) only
    loader = (PACKAGE / "core" / "_scripts.py").read_text(encoding="utf-8")
    assert "client.register_script(source(op))" in loader


UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve"}


def test_no_pickle_or_eval_of_data_in_the_package() -> None:
    """Our own stored data (owner, registry, audit, wake copies) is JSON; the task message
    serializer is the user's business, never ours."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                problems += [
                    (path.name, node.lineno, a.name)
                    for a in node.names
                    if a.name.split(".")[0] in UNSAFE_MODULES
                ]
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] in UNSAFE_MODULES:
                    problems.append((path.name, node.lineno, node.module))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("eval", "exec", "__import__"):
                    problems.append((path.name, node.lineno, node.func.id))
            elif isinstance(node, ast.Constant) and node.value == "pickle":
                problems.append((path.name, node.lineno, "'pickle' (a serializer name?)"))
    assert problems == []
