"""A setting's value as a job file holds it: written as TOML that reads back equal, the line of a
file that sets a key, a dataclass field's docstring (its help), and the checks and words of an
error about a value (naming the key and the bad value)."""

from __future__ import annotations

import difflib
import json
import math
import re
from typing import Any, get_origin


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key} = {value!r} is not one of {', '.join(choices)}")


def check_positive(key: str, value: float, allow_zero: bool = False) -> None:
    # TOML reads nan and inf as floats, and nan passes every comparison's refusal: without this
    # a rate of nan reached torch at the first step, unnamed ("Invalid learning rate: nan").
    if not math.isfinite(value):
        raise ValueError(f"{key} = {value!r} must be a finite number")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{key} = {value!r} must be {'>= 0' if allow_zero else '> 0'}")


def check_counts(section: str, config: Any, *names: str) -> None:
    """Each named setting of `config` is >= 0."""
    for name in names:
        check_positive(f"{section}.{name}", getattr(config, name), allow_zero=True)


def check_elements(key: str, value: list | dict, kind: type) -> None:
    """Element types of a list (or a dict's keys: str, values: `kind`); the loader only checks the
    container."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for k, v in items:
        if isinstance(value, dict) and not isinstance(k, str):
            raise ValueError(f"{key} = {value!r}: key {k!r} should be a string")
        if not isinstance(v, kind) or isinstance(v, bool):
            raise ValueError(f"{key} = {value!r}: {v!r} should be {type_words(kind)}")


_TYPE_WORDS = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a table",
}


def type_words(kind: Any) -> str:
    """What a value of type `kind` is called in an error message: "an integer", not <class
    'int'>."""
    return _TYPE_WORDS.get(get_origin(kind) or kind, getattr(kind, "__name__", str(kind)))


def did_you_mean(name: str, known: Any) -> str:
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {near[0]}?" if near else f" (known: {', '.join(sorted(known))})"


def toml_key(name: str) -> str:
    """A TOML key: bare where it may be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else toml_value(name)


def toml_value(value: Any) -> str:
    """`value` as TOML that reads back equal (config.toml, --set items, the ranks' resolved job)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return (
            "{ "
            + ", ".join(f"{toml_value(str(k))} = {toml_value(v)}" for k, v in value.items())
            + " }"
        )
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        # JSON's escapes are TOML's, but for characters outside the BMP (JSON writes surrogate
        # pairs, which TOML refuses): keep those as they are, and escape DEL, which TOML refuses
        # raw.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    return json.dumps(value)


_TOML_HEADER = re.compile(r"\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_TOML_KEY = re.compile(rf"\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_PART = re.compile(r"""\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*(?:\.|$)""")


def _key_parts(dotted: str) -> tuple[str, ...]:
    """A dotted TOML key's parts as the parsed file names them: `tables."*".kind` is
    ("tables", "*", "kind"), quotes gone (a quoted part may hold dots)."""
    return tuple(next(p for p in m.groups() if p is not None) for m in _PART.finditer(dotted))


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """The 1-based line that sets each key of a job file (tables' headers too), by its dotted
    path: `[sharding.constraints]` then `t_C3 = {...}` is ("sharding", "constraints", "t_C3").
    Bare and quoted keys (`[tables."*"]`); a line inside a multi-line array or string that looks like a
    key is harmless (errors only read it for a line number)."""
    out: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        header = _TOML_HEADER.match(line)
        if header:
            table = _key_parts(header[1])
            out.setdefault(table, number)
            continue
        key = _TOML_KEY.match(line)
        if key:
            out.setdefault((*table, *_key_parts(key[1])), number)
    return out


def field_help(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal after it), for CLI help and docs."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    helps = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            helps[node.target.id] = nxt.value.value  # type: ignore[union-attr]
    return helps
