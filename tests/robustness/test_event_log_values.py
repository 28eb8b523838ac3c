"""A value of a text event log that pyarrow does not read as a number (a space, a sign, a `_`
that Python's int() and float() would take) is refused naming its line and column, as any bad
value is; a word for a missing value names the key that reads it as one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli

HEADER = "uid,item_id,timestamp,is_organic,event_type,played_ratio_pct"
GOOD = ["0,1,100,1,listen,80", "0,2,110,1,like,", "1,1,120,0,listen,30"]


def _refusal(tmp_path: Path, column: int, value: str):
    """preprocess --events of a three-event CSV log whose line 3 holds `value` in `column`."""
    fields = GOOD[1].split(",")
    fields[column] = value
    log = tmp_path / "events.csv"
    log.write_text("\n".join([HEADER, GOOD[0], ",".join(fields), GOOD[2]]) + "\n")
    spec = tmp_path / "spec.toml"
    spec.write_text('[format]\nkind = "csv"\n')
    return log, cli("preprocess", log, "--events", spec, "--out", tmp_path / "out", ok=False)


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        (0, " 0", r"uid: ' 0' is not an integer$"),
        (2, "+110", r"timestamp: '\+110' is not an integer$"),
        (5, "1_0", r"played_ratio_pct: '1_0' is not a number \(the percent played\)$"),
        (0, "-99999999999999999999", r"uid: -99999999999999999999 is negative$"),
    ],
    ids=["a space", "a plus sign", "an underscore", "below int64"],
)
def test_a_value_pyarrow_does_not_read_is_refused_naming_its_line(tmp_path, column, value, said):
    # Before: "error: Failed to parse string: ' 0' as a scalar of type int64", no file or line.
    log, result = _refusal(tmp_path, column, value)
    assert_one_line_error(result, rf"^error: {re.escape(str(log))}:3: {said}")


@pytest.mark.parametrize(
    "lines",
    [
        [HEADER, GOOD[0], "", "0,2,110,1,lisen,", GOOD[2]],
        ["", HEADER, GOOD[0], "\r", "", "0,2,110,1,lisen,", GOOD[2]],
    ],
    ids=["between rows", "before the header and between rows"],
)
def test_a_refusal_after_empty_lines_names_the_line_that_holds_the_value(tmp_path, lines):
    # pyarrow reads empty lines as no rows; the refusal counted rows, one a line, and named line 3
    # (the good row `0,1,100,...` or the empty line) where `lisen` is on line 4, or 6.
    log = tmp_path / "events.csv"
    log.write_text("\n".join(lines) + "\n")
    spec = tmp_path / "spec.toml"
    spec.write_text('[format]\nkind = "csv"\n')
    result = cli("preprocess", log, "--events", spec, "--out", tmp_path / "out", ok=False)
    line = lines.index("0,2,110,1,lisen,") + 1
    assert_one_line_error(
        result, rf"^error: {re.escape(str(log))}:{line}: event_type: 'lisen' is not one of "
    )
