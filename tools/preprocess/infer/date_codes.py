"""Columns of date codes (spec_infer): digits of one width that read as a day or an hour
(YYYYMMDD, YYMMDDHH as Avazu's `hour`, YYYYMMDDHH). They are proposed as categoricals, as codes of
one width are, but said in a warning: a log sorted by time holds later codes after the sample
(validation, test, the next day's log), ids that no row trained on, and a hash_size fitted to the
sample's few values sends them onto rows that other days trained."""

from __future__ import annotations

import datetime

# (code, strptime format, what one value is), by width; the first that reads every value wins.
_CODES: dict[int, tuple[tuple[str, str, str], ...]] = {
    8: (("YYYYMMDD", "%Y%m%d", "day"), ("YYMMDDHH", "%y%m%d%H", "hour")),
    10: (("YYYYMMDDHH", "%Y%m%d%H", "hour"),),
}
_YEARS = (1970, 2100)
"""Years a code may name: a four-digit year outside them is no date (1410 of 14102100)."""


def date_codes(values: list[str]) -> tuple[str, str, str] | None:
    """(the code, `first .. last` of the values, "day" or "hour") where every value is digits of
    one width that read as one code, else None."""
    distinct = set(values)
    widths = {len(v) for v in distinct}
    if len(widths) != 1 or not all(v.isdigit() for v in distinct):
        return None
    for code, fmt, unit in _CODES.get(widths.pop(), ()):
        try:
            times = sorted(datetime.datetime.strptime(v, fmt) for v in distinct)
        except ValueError:
            continue
        if _YEARS[0] <= times[0].year and times[-1].year < _YEARS[1]:
            shown = "%Y-%m-%d" if unit == "day" else "%Y-%m-%d %Hh"
            return code, f"{times[0]:{shown}} .. {times[-1]:{shown}}", unit
    return None


def date_codes_advice(found: dict[str, tuple[str, str, str]], rows: int) -> str:
    """The warning for the categorical columns of date codes `found` (name: date_codes'), "" for
    none."""
    if not found:
        return ""
    said = ", ".join(f"{name} ({code}, {span})" for name, (code, span, _) in found.items())
    units = sorted({unit for _, _, unit in found.values()})
    return (
        f"{said}: date codes in the first {rows:,} rows, proposed as categoricals: the "
        f"{' and '.join(u + 's' for u in units)} after these (validation, test, the next day's "
        "log) are ids no row trained on; derive an hour of day or a day of week from them before "
        'preprocessing, or give them role = "ignore"'
    )
