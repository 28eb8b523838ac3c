"""What a table's kind and its id map's settings are, without torch: the job file's `[tables.X]`
sections hold these values (trainer.job.config reads them), the planner prices them.

Kinds:
- `static`: today's table, `cardinality` rows, ids fixed by preprocessing (hashing or vocabulary);
- `managed`: a raw-id feature's table of `rows + 2` rows: row 0 for a missing value, row 1 shared
  by every id without a slot of its own, rows 2.. the `rows` slots an id map hands out and takes
  back (admission after `admit_after` sightings, eviction by `policy` and `max_age`, every
  `evict_every` steps; the sighting counts shifted right `decay` bits a day);
- `hashed`: a raw-id feature hashed into the same `rows + 2` rows (row 2 + mix64(id) mod rows):
  collisions instead of admission, the baseline managed tables are measured against;
- `unbounded`: a managed table that never evicts and admits an id at its first sighting, `rows`
  as large as the ids it will meet (every distinct id of the data): a vocabulary of every id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardrec.dataloader.util.near import did_you_mean

KINDS = ("static", "managed", "hashed", "unbounded")
POLICIES = ("lru", "lfu", "age")
RAW_KINDS = ("managed", "hashed", "unbounded")
"""The kinds a raw-id feature's table may be (a static table needs ids that are rows)."""
MAPPED_KINDS = ("managed", "unbounded")
"""The kinds that keep an id map (hashed needs none)."""
MISSING_ROW = 0
"""The row of a missing value in a raw-id table."""
SHARED_ROW = 1
"""The row of every id that has no slot of its own (not yet admitted, or no slot free)."""
FIRST_SLOT_ROW = 2
"""The row of slot 0."""
_AGE = re.compile(r"^\s*(\d+)\s*(steps?|days?)\s*$")


@dataclass(frozen=True)
class MaxAge:
    """Ids unseen for this long lose their slot: `amount` steps, or days (a day is a stretch of a
    run that goes on: the data of one `--continue-on`)."""

    amount: int
    unit: str
    """"steps" or "days"."""

    def __str__(self) -> str:
        return f"{self.amount} {self.unit}"


def parse_max_age(key: str, text: str) -> MaxAge | None:
    """`"N steps"` or `"N days"` (None for ""); ValueError naming `key` otherwise."""
    if not text:
        return None
    match = _AGE.match(text)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(
            f'{key} = {text!r}: expected "N steps" or "N days" with N >= 1 (or "" for none)'
        )
    unit = "steps" if match.group(2).startswith("step") else "days"
    return MaxAge(int(match.group(1)), unit)


@dataclass
class TableSettings:
    """One table's kind and, for a raw-id feature, how its rows are handed out (the job file's
    `[tables.FEATURE]`)."""

    kind: str = "static"
    """static (rows fixed by preprocessing), managed (an id map hands out `rows` slots), hashed
    (raw ids hashed into `rows` rows: the baseline) or unbounded (an id map that never evicts)."""
    rows: int = 0
    """Slots of a managed, hashed or unbounded table (the table has rows + 2: row 0 for a missing
    value, row 1 shared by ids without a slot); `shardrec plan` proposes one from the data."""
    policy: str = "lru"
    """Which ids lose their slot when new ones need it: lru (least recently seen), lfu (least
    often seen) or age (none: only max_age frees slots)."""
    admit_after: int = 2
    """Sightings before an id gets a slot of its own (until then it shares row 1)."""
    evict_every: int = 0
    """Steps between the id map's updates (admissions, evictions); each stretch of a run also
    starts with one. 0: 1/50 of the stretch's steps."""
    max_age: str = ""
    """Ids unseen for this long lose their slot, whatever the policy: "N steps" or "N days" (a day
    is a stretch, the data of one `--continue-on`); "" for none."""
    candidates: float = 1.0
    """Ids waiting for a slot (seen, not yet admitted) kept per slot; past that the rarest are
    forgotten."""
    decay: int = 0
    """Bits every slot's and waiting id's sighting count is shifted right by after each new day's
    first update (a day is a stretch, the data of one `--continue-on`), so that lfu forgets the
    traffic of ids that faded; 0: counts over the whole run."""

    def check(self, key: str, rows_given: bool = True) -> None:
        """ValueError (one line naming `key`.field and the value) for a bad setting. Without
        `rows_given` a raw-id kind may lack rows: `shardrec plan` proposes them, `train` refuses
        the table (embeddings.dims)."""
        if self.kind not in KINDS:
            raise ValueError(
                f"{key}.kind = {self.kind!r} is not one of {', '.join(KINDS)}"
                f"{did_you_mean(self.kind, KINDS)}"
            )
        if self.policy not in POLICIES:
            raise ValueError(
                f"{key}.policy = {self.policy!r} is not one of {', '.join(POLICIES)}"
                f"{did_you_mean(self.policy, POLICIES)}"
            )
        if self.decay and self.kind != "managed":
            raise ValueError(
                f"{key}.decay = {self.decay}: a table of kind {self.kind!r} keeps no counts that "
                'decide who holds a slot; leave decay out (or use kind = "managed")'
            )
        if self.kind == "static":
            if self.rows:
                raise ValueError(
                    f"{key}.rows = {self.rows}: a static table has the rows preprocessing gave it; "
                    'set kind = "managed" (or hashed) for a row budget'
                )
            return
        if self.rows < 1 and rows_given:
            raise ValueError(
                f"{key}.rows = {self.rows}: a {self.kind} table needs at least 1 slot "
                "(`shardrec plan` proposes a budget from the data)"
            )
        if self.admit_after < 1:
            raise ValueError(f"{key}.admit_after = {self.admit_after}: must be >= 1")
        if self.evict_every < 0:
            raise ValueError(f"{key}.evict_every = {self.evict_every}: must be >= 0")
        if not 0 < self.candidates <= 64:
            raise ValueError(f"{key}.candidates = {self.candidates}: must lie in (0, 64]")
        if not 0 <= self.decay <= 62:
            raise ValueError(f"{key}.decay = {self.decay}: must lie in 0..62 (bits)")
        age = parse_max_age(f"{key}.max_age", self.max_age)
        if (
            age is not None
            and age.unit == "steps"
            and self.evict_every
            and (age.amount < self.evict_every)
        ):
            raise ValueError(
                f"{key}.max_age = {self.max_age!r} is below {key}.evict_every = "
                f"{self.evict_every}: ids would age out between two updates; raise max_age"
            )
        if self.kind == "unbounded" and (self.policy != "lru" or self.max_age):
            raise ValueError(
                f"{key}.kind = 'unbounded' never evicts: leave out policy and max_age "
                '(or use kind = "managed")'
            )
        if self.policy == "age" and age is None and self.kind == "managed":
            raise ValueError(
                f"{key}.policy = 'age' frees slots by age only: give {key}.max_age "
                '("N steps" or "N days")'
            )

    def check_cadence(self, key: str, stretch_steps: int, resumed: bool = False) -> None:
        """ValueError (one line naming `key`) where max_age in steps is below the steps between
        two updates that `evict_every = 0` takes from a stretch of `stretch_steps` steps (`resumed`:
        the steps the stretch a resume goes on with began with, which it keeps): `check` refuses
        the same for a given evict_every."""
        age = self.age
        if self.kind != "managed" or self.evict_every or age is None or age.unit != "steps":
            return
        every = self.cadence(stretch_steps)
        if age.amount < every:
            steps = "this stretch began with" if resumed else "this job trains"
            raise ValueError(
                f"{key}.max_age = {self.max_age!r} is below the {every} steps between two "
                f"updates ({key}.evict_every unset: 1/50 of the {stretch_steps:,} steps {steps}): "
                f"ids would age out between two updates; raise max_age or set {key}.evict_every"
            )

    @property
    def table_rows(self) -> int:
        """Rows of the embedding table: the slots, the missing row and the shared row."""
        return self.rows + FIRST_SLOT_ROW

    @property
    def age(self) -> MaxAge | None:
        return parse_max_age("max_age", self.max_age)

    @property
    def admit(self) -> int:
        """Sightings before admission (unbounded: the first)."""
        return 1 if self.kind == "unbounded" else self.admit_after

    @property
    def evicts(self) -> bool:
        """Whether used slots may be taken for new ids (lru, lfu; never for age or unbounded)."""
        return self.kind == "managed" and self.policy in ("lru", "lfu")

    def cadence(self, stretch_steps: int) -> int:
        """Steps between updates in a stretch of `stretch_steps` steps."""
        return self.evict_every or max(1, stretch_steps // 50)
