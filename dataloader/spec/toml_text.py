"""Values written as TOML, for the spec files shardrec writes (`spec infer`, `spec show`): what
tomllib reads back equal (tomllib reads; the standard library has no writer)."""

from __future__ import annotations

import json
from typing import Any


def toml_value(value: Any) -> str:
    """`value` (bool, str, number, list or dict of them) as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
        )
    return repr(value)
