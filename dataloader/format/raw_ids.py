"""Raw ids: a categorical kept as a 64-bit value instead of a table row (`shardrec preprocess
--raw-ids`), so that the model's managed tables, not the preprocessor, decide where an id lives.

A raw-id column holds, per value, the 64-bit id as it was written: an integer as it is (two's
complement: -1 is 2^64 - 1), a hex value as decoded, a string by the feature-spec path's 64-bit
hash of its bytes; no modulo, so two ids share a row only where a table says so. The one value
that cannot be an id is MISSING_KEY (2^63), the empty field. Neither 0 nor -1 could be it: both
are ids real logs use. 2^63 is outside the integers a field may hold (+-(2^63 - 1)) and is written
only as the hex value `8000000000000000`, which preprocessing refuses as a malformed row, so no
id is ever silently read as missing.

The manifest marks such a feature `ids = "raw"` with cardinality 0 (it has no fixed number of
rows); the loader passes its values on as int64 bit patterns.
"""

from __future__ import annotations

MISSING_KEY = 1 << 63
"""The raw id of an empty field (and an unused slot of an id map)."""
RAW = "raw"
"""A sparse feature's `ids` in the manifest when it holds raw ids."""
