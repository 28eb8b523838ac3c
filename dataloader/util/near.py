"""The one "did you mean" of a mistyped name or value: the closest of the known ones, so that a
refusal can name what was meant beside the list of what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`"; did you mean X?"` for the known name closest to `word`, "" where none is close.

    Case is ignored in the comparison (--raw-ids c3 means C3: difflib alone finds them too far
    apart), and the name is given back as it is known."""
    by_folded = {k.casefold(): k for k in known}
    near = difflib.get_close_matches(word.casefold(), list(by_folded), n=1)
    return f"; did you mean {by_folded[near[0]]}?" if near else ""


def name_list(names: list[str], shown: int = 30) -> str:
    """`names` for a refusal's list of what is allowed: all of them where they are few, else the
    first `shown` and how many more (a spec of hundreds of columns would bury the line)."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f", ... and {more:,} more" if more > 0 else "")
