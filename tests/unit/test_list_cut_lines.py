"""The line that says a list column was cut at max_length: its share of rows never reads 0% for
some rows nor 100% for not all of them."""

from __future__ import annotations

from shardrec.tools.preprocess.tasks.bad_rows import ListsCut, list_cut_lines, lists_cut


def test_a_few_rows_cut_are_not_0_percent_and_nearly_all_not_100():
    cuts = lists_cut([{"genres": [3, 1, 2]}, {"genres": [3, 1, 4], "tags": [2, 999, 999]}])
    assert cuts == {"genres": ListsCut(3, 2, 6), "tags": ListsCut(2, 999, 999)}
    assert list_cut_lines(cuts, 1000, "what to do") == [
        "genres: 2 rows (<1%) had more than max_length = 3 values; 6 values left out (what to do)",
        "tags: 999 rows (>99%) had more than max_length = 2 values; 999 values left out (what "
        "to do)",
    ]
    assert list_cut_lines({"g": ListsCut(3, 10, 30)}, 10, "x")[0].startswith("g: 10 rows (100%)")
