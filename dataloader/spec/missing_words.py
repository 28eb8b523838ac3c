"""Words some writers put for a missing value (R's NA, SQL's NULL, pandas' NaN, MySQL's \\N), and
what a refusal of such a word as a number says: the spec key (`[format] missing`) that reads it
as an empty field. A click log's parser (tools.preprocess.parse) and an event log's reader
(tools.preprocess.events) both refuse with it; `spec infer` proposes the key from them."""

from __future__ import annotations

from shardrec.dataloader.spec.toml_text import toml_value

MISSING_WORDS = frozenset(
    {"NA", "N/A", "n/a", "na", "NaN", "nan", "NULL", "null", "Null", "None", "none", "?", "-"}
    | {"\\N"}
)


def missing_word_hint(value: str, missing: tuple[str, ...]) -> str:
    """What a refusal of `value` as a number adds where it is a word for a missing value that
    the spec's `missing` lacks: the key that reads it as one (empty otherwise)."""
    if value not in MISSING_WORDS or value in missing:  # in missing: read as missing already
        return ""
    key = toml_value([*missing, value])
    return f" (a word for a missing value? [format] missing = {key} reads it as one)"
