"""Values built from a task's arguments: ``"api:{customer_id}"`` templates and callables.

A template's placeholders name the task function's parameters; they are checked when the task
is decorated, so a misspelt one is an import-time error, never a semaphore shared by every call.
At call time the placeholders take the call's bound arguments (positional or keyword, defaults
applied, ``self`` of a bound task left out).

``None`` is formatted as :data:`NONE_TEXT` (``"~none"``), and a value whose text starts with
``~`` gets one more ``~`` in front, so ``None`` never meets a string (not even ``"None"`` or
``"~none"``).  Long values are fine: the core hashes names too long to be readable in a key.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["NONE_TEXT", "ArgsFn", "Template", "call_arguments", "parameters"]

NONE_TEXT = "~none"
#: a callable that receives the bound arguments (a dict of parameter name -> value)
ArgsFn = Callable[[Mapping[str, Any]], Any]


class _Formatter(string.Formatter):
    def convert_field(self, value: Any, conversion: str | None) -> Any:
        return None if value is None else super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> str:
        if value is None:
            return NONE_TEXT
        text = str(super().format_field(value, format_spec))
        return "~" + text if text.startswith("~") else text


_FORMATTER = _Formatter()


@dataclass(frozen=True)
class Template:
    """A ``str.format`` template whose fields are parameter names."""

    text: str
    #: the parameter each placeholder names (the part before any ``.attr`` or ``[key]``)
    fields: tuple[str, ...]

    @classmethod
    def parse(cls, param: str, text: str) -> Template:
        fields: list[str] = []
        try:
            for _literal, field, _spec, _conv in _FORMATTER.parse(text):
                if field is None:
                    continue
                root = field.split(".", 1)[0].split("[", 1)[0]
                if not root.isidentifier():
                    raise ValueError(f"placeholder {{{field}}} does not name a parameter")
                fields.append(root)
        except ValueError as exc:
            raise ValueError(
                f"{param}={text!r} is not accepted: {exc}; use a template whose placeholders "
                "are the task's parameter names, e.g. 'api:{customer_id}' (write {{ and }} "
                "for literal braces)"
            ) from None
        return cls(text, tuple(dict.fromkeys(fields)))

    @property
    def dynamic(self) -> bool:
        return bool(self.fields)

    def check(self, param: str, params: Sequence[str], var_keyword: bool, where: str) -> None:
        """Every placeholder must be a parameter of the task (any name is accepted when the
        function takes ``**kwargs``; a missing one then fails at call time)."""
        unknown = [f for f in self.fields if f not in params]
        if unknown and not var_keyword:
            fields = ", ".join(f"{{{u}}}" for u in unknown)
            raise ValueError(
                f"{where}: {param}={self.text!r} uses {fields}, which is not a parameter of "
                "the task (the text is a template: each {field} takes that argument of the "
                "call); accepted placeholders: "
                f"{', '.join(f'{{{p}}}' for p in params) or '(the task has no parameters)'}; "
                f"for literal braces, double them: {param}={self.literal(unknown)!r}"
            )

    def literal(self, fields: Sequence[str]) -> str:
        """The text with the placeholders of ``fields`` written as literal braces."""
        out = []
        for literal, field, spec, conv in _FORMATTER.parse(self.text):
            out.append(literal.replace("{", "{{").replace("}", "}}"))
            if field is None:
                continue
            inner = field + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
            root = field.split(".", 1)[0].split("[", 1)[0]
            out.append(f"{{{{{inner}}}}}" if root in fields else f"{{{inner}}}")
        return "".join(out)

    def render(self, arguments: Mapping[str, Any]) -> str:
        missing = [f for f in self.fields if f not in arguments]
        if missing:
            raise ValueError(
                f"template {self.text!r}: no argument {', '.join(missing)} in this call "
                f"(arguments: {', '.join(arguments) or 'none'}); for literal braces, double "
                f"them: {self.literal(missing)!r}"
            )
        return _FORMATTER.vformat(self.text, (), arguments)


def parameters(fun: Callable[..., Any]) -> tuple[list[str], bool]:
    """The parameter names a template may use (a first ``self`` left out: ``bind=True``), and
    whether the function takes ``**kwargs``."""
    sig = inspect.signature(fun)
    names: list[str] = []
    var_keyword = False
    for i, p in enumerate(sig.parameters.values()):
        if p.kind is p.VAR_KEYWORD:
            var_keyword = True
        elif p.kind is not p.VAR_POSITIONAL and not (i == 0 and p.name == "self"):
            names.append(p.name)
    return names, var_keyword


def call_arguments(
    signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults applied; ``**kwargs`` merged in."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update({k: v for k, v in value.items() if k not in out})
        else:
            out[name] = value
    return out
