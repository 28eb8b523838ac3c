"""A drifting click log in Criteo's text format (`shardrec synth --like drift`): days in which new
items appear and old ones fade, with a learnable signal tied to each id, at Criteo-like skew.

Files `day_0` .. `day_{D-1}`: a 0/1 label, 13 integer columns, 26 categoricals written as 16 hex
digits (64-bit ids, as `shardrec preprocess --raw-ids` keeps them), tab-separated, empty where
missing. What the seed fixes, per categorical:
- its initial population (log-uniform 4 .. max_vocab ids, as `synth`'s), its Zipf skew in [1.05,
  1.4] and missing rate;
- its churn: a third of the tables (the smallest) are static; the others bring new ids every hour,
  10%, 30% or 100% of the initial population a day, each hour's ids a cohort whose popularity rises
  and fades with age x (days) as (x / tau) e^(1 - x / tau), tau = 4, 2 or 1 days; the initial
  population fades slowly (e^(-x / 8));
- its signal: an informative table gives each id an effect drawn from a counter-based hash of the
  id (normal, sd 0.9: no stored table, unbounded ids, fixed for the id's life); one user x item pair
  adds the dot product of 4-dim vectors hashed from both ids; the label is logistic in the effects,
  the dense columns and a small daily bias.
A row's time is uniform within its day and rows are written in time order, so an id born at noon
appears from noon on. A new id's effect can be learned only from its own sightings: what a managed
table's admission is for. The parameters are fixed here once, not tuned to any result.

Text is assembled as byte matrices (criteo.py's approach): no per-row Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardrec.dataloader.util.files import atomic_path
from shardrec.dataloader.util.splitmix import mix64
from shardrec.tools.synth.criteo import NUM_DENSE, NUM_SPARSE, int_bytes, open_out

HOURS = 24
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_PAD = 0
_CHUNK_ROWS = 1 << 16
BIRTHS = (0.1, 0.3, 1.0)
"""New ids a day, as a share of a churning table's initial population."""
LIFETIMES = (4.0, 2.0, 1.0)
"""Days at which a cohort's popularity peaks (and fades after)."""
INITIAL_FADE_DAYS = 8.0
_K_EFFECT = np.uint64(0x6A09E667F3BCC909)
_K_VECTOR = np.uint64(0xBB67AE8584CAA73B)


@dataclass(frozen=True)
class DriftSpec:
    """The hidden world of a drifting log; fixed by the seed."""

    seed: int
    days: int
    population: np.ndarray  # [26] initial ids per categorical
    zipf_a: np.ndarray  # [26]
    missing: np.ndarray  # [26 + 13]
    births: np.ndarray  # [26] new ids a day as a share of the population (0: static)
    lifetime: np.ndarray  # [26] days
    informative: np.ndarray  # [26] bool
    dense_beta: np.ndarray  # [13]
    daily_bias: np.ndarray  # [days]
    pair: tuple[int, int]  # the user x item pair of categoricals
    salt: int

    @classmethod
    def from_seed(cls, seed: int, days: int, max_vocab: int = 100_000) -> DriftSpec:
        rng = np.random.default_rng([seed, 0xD21F7])
        population = np.round(np.exp(rng.uniform(np.log(4), np.log(max_vocab), NUM_SPARSE))).astype(
            np.int64
        )
        order = np.argsort(population, kind="stable")
        births, lifetime = np.zeros(NUM_SPARSE), np.ones(NUM_SPARSE)
        churning = order[NUM_SPARSE // 3 :]  # the smallest third stays static
        kind = rng.integers(0, 3, len(churning))
        births[churning] = np.asarray(BIRTHS)[kind]
        lifetime[churning] = np.asarray(LIFETIMES)[kind]
        informative = rng.random(NUM_SPARSE) < np.where(births > 0, 0.5, 0.25)
        pair = tuple(int(x) for x in rng.choice(churning, 2, replace=False))
        return cls(
            seed=seed,
            days=days,
            population=population,
            zipf_a=rng.uniform(1.05, 1.4, NUM_SPARSE),
            missing=np.concatenate(
                [
                    rng.choice([0.0, 0.0, 0.05, 0.3], NUM_SPARSE),
                    rng.choice([0.0, 0.1, 0.4], NUM_DENSE),
                ]
            ),
            births=births,
            lifetime=lifetime,
            informative=informative,
            dense_beta=rng.normal(0.0, 0.25, NUM_DENSE),
            daily_bias=-1.3 + rng.uniform(-0.1, 0.1, days),
            pair=(pair[0], pair[1]),
            salt=int(rng.integers(1, 2**63)),
        )

    def cohort_size(self, f: int) -> int:
        """Ids born in one hour in table f."""
        return max(1, round(self.births[f] * self.population[f] / HOURS))


def _intensity(age: np.ndarray, tau: float) -> np.ndarray:
    """A cohort's popularity at `age` days (0 before its birth)."""
    x = np.maximum(age, 0.0) / tau
    return np.where(age >= 0, x * np.exp(1.0 - x), 0.0)


def _zipf_cdf(n: int, a: float) -> np.ndarray:
    cdf = np.cumsum(1.0 / np.arange(1, n + 1) ** a)
    return cdf / cdf[-1]


def _ids(spec: DriftSpec, f: int, cohort: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """64-bit ids: a bijection of (table, cohort, rank), so ids never collide."""
    z = (
        (np.uint64(f) << np.uint64(58))
        | ((cohort + 1).astype(np.uint64) << np.uint64(32))
        | rank.astype(np.uint64)
    )
    return mix64(z ^ np.uint64(spec.salt))


def _normal(values: np.ndarray, key: np.uint64) -> np.ndarray:
    """A standard normal per id, from two hashes of it (Box-Muller)."""
    a = mix64(values ^ key)
    b = mix64(a ^ key)
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    u2 = (b >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def draw_table(spec: DriftSpec, rng: np.random.Generator, f: int, times: np.ndarray) -> np.ndarray:
    """Ids of table f for rows at `times` (days, sorted)."""
    n = len(times)
    if spec.births[f] == 0:
        cdf = _zipf_cdf(int(spec.population[f]), spec.zipf_a[f])
        rank = np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)
        return _ids(spec, f, np.full(n, -1), rank)
    initial = _zipf_cdf(int(spec.population[f]), spec.zipf_a[f])
    hourly = _zipf_cdf(spec.cohort_size(f), spec.zipf_a[f])
    hour = np.floor(times * HOURS).astype(np.int64)
    cohort = np.empty(n, np.int64)
    for h in np.unique(hour):
        rows = np.flatnonzero(hour == h)
        t = (h + 0.5) / HOURS
        births = np.arange(h + 1) / HOURS
        weight = np.concatenate(
            [
                [spec.population[f] * np.exp(-t / INITIAL_FADE_DAYS)],
                spec.cohort_size(f) * _intensity(t - births, spec.lifetime[f]),
            ]
        )
        cdf = np.cumsum(weight)
        cohort[rows] = np.searchsorted(cdf / cdf[-1], rng.random(len(rows))) - 1
    rank = np.empty(n, np.int64)
    first = cohort < 0
    rank[first] = np.searchsorted(initial, rng.random(int(first.sum())))
    rank[~first] = np.searchsorted(hourly, rng.random(int((~first).sum())))
    return _ids(spec, f, cohort, rank)


def _hex16(values: np.ndarray, missing: np.ndarray) -> np.ndarray:
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    out = _HEX[((values[:, None] >> shifts) & np.uint64(0xF)).astype(np.int64)]
    out[missing] = _PAD
    return out


def format_day_rows(labels, dense, dense_missing, values, sparse_missing) -> bytes:
    n = len(labels)
    sep = np.full((n, 1), ord("\t"), dtype=np.uint8)
    cols = [np.full((n, 1), ord("0"), dtype=np.uint8) + labels[:, None].astype(np.uint8)]
    for j in range(NUM_DENSE):
        cols += [sep, int_bytes(dense[:, j], dense_missing[:, j], False)]
    for f in range(NUM_SPARSE):
        cols += [sep, _hex16(values[:, f], sparse_missing[:, f])]
    cols.append(np.full((n, 1), ord("\n"), dtype=np.uint8))
    matrix = np.concatenate(cols, axis=1)
    return matrix[matrix != _PAD].tobytes()


@dataclass
class DayStats:
    """What one day brought, over the churning tables (and per table in `tables`)."""

    day: int
    rows: int
    distinct: int = 0
    new_distinct_share: float = 0.0
    """Ids never seen on an earlier day, as a share of the day's distinct ids."""
    new_traffic_share: float = 0.0
    """Their lookups, as a share of the day's lookups."""
    singleton_share: float = 0.0
    """Ids seen once that day, as a share of its distinct ids."""
    tables: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per table: its distinct, new and singleton ids and lookups, the rows holding 99% of the
    lookups at K = 1 and 2, and the distinct ids of every day so far."""


def _table_stats(ids: np.ndarray, seen: np.ndarray) -> dict[str, float]:
    values, counts = np.unique(ids, return_counts=True)
    new = ~np.isin(values, seen, assume_unique=True)
    desc = np.sort(counts)[::-1]
    out = {
        "distinct": int(len(values)),
        "new": int(new.sum()),
        "new_lookups": int(counts[new].sum()),
        "lookups": int(counts.sum()),
        "singletons": int((counts == 1).sum()),
    }
    for k in (1, 2):
        kept = desc[desc >= k]
        out[f"rows_99_k{k}"] = (
            int(np.searchsorted(np.cumsum(kept), 0.99 * kept.sum()) + 1) if len(kept) else 0
        )
    return out


def write_drift(
    out_dir: Path, rows: int, seed: int, days: int = 6, max_vocab: int = 100_000
) -> tuple[list[Path], list[DayStats]]:
    """Write `day_0` .. `day_{days-1}` (rows split evenly) and say what each day brought."""
    if days < 1:
        raise ValueError(f"--days {days}: a drifting log needs at least one day")
    spec = DriftSpec.from_seed(seed, days, max_vocab)
    out_dir.mkdir(parents=True, exist_ok=True)
    churning = [f for f in range(NUM_SPARSE) if spec.births[f] > 0]
    seen = {f: np.zeros(0, np.uint64) for f in range(NUM_SPARSE)}
    paths, stats = [], []
    for day in range(days):
        n = rows // days + (1 if day < rows % days else 0)
        rng = np.random.default_rng([spec.seed, 0xDA7, day])
        path = out_dir / f"day_{day}"
        drawn = {f: [] for f in range(NUM_SPARSE)}
        with atomic_path(path, fsync=False) as tmp, open_out(tmp, False, None) as out:
            for start in range(0, n, _CHUNK_ROWS):
                m = min(_CHUNK_ROWS, n - start)
                # Each chunk is a slice of the day's time: chunks follow one another in time.
                labels, dense, dmiss, values, smiss = _draw_chunk(spec, rng, day, start, m, n)
                out.write(format_day_rows(labels, dense, dmiss, values, smiss))
                for f in range(NUM_SPARSE):
                    drawn[f].append(values[~smiss[:, f], f])
        paths.append(path)
        stats.append(_day_stats(day, n, drawn, seen, set(churning)))
    return paths, stats


def _draw_chunk(
    spec: DriftSpec, rng: np.random.Generator, day: int, start: int, m: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows [start, start + m) of day `day` (n rows), their times in [start / n, (start + m) / n):
    labels, dense ints, dense missing, ids [m, 26] (uint64), ids missing."""
    lo, hi = start / n, (start + m) / n
    times = day + lo + np.sort(rng.random(m)) * (hi - lo)
    values = np.stack([draw_table(spec, rng, f, times) for f in range(NUM_SPARSE)], axis=1)
    sparse_missing = rng.random((m, NUM_SPARSE)) < spec.missing[:NUM_SPARSE]
    dense = np.floor(rng.lognormal(1.0, 1.5, (m, NUM_DENSE))).astype(np.int64)
    dense_missing = rng.random((m, NUM_DENSE)) < spec.missing[NUM_SPARSE:]
    logit = np.full(m, spec.daily_bias[day])
    for f in np.flatnonzero(spec.informative):
        effect = 0.9 * _normal(values[:, f], _K_EFFECT + np.uint64(f))
        logit += np.where(sparse_missing[:, f], 0.0, effect)
    u, v = spec.pair
    dot = sum(
        _normal(values[:, u], _K_VECTOR + np.uint64(k))
        * _normal(values[:, v], _K_VECTOR + np.uint64(k + 4))
        for k in range(4)
    )
    logit += np.where(sparse_missing[:, u] | sparse_missing[:, v], 0.0, 0.5 * dot)
    x = np.log1p(np.maximum(dense, 0)) - 1.0
    logit += np.where(dense_missing, 0.0, x) @ spec.dense_beta
    labels = (rng.random(m) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return labels, dense, dense_missing, values, sparse_missing


def _day_stats(day: int, rows: int, drawn: dict, seen: dict, churning: set[int]) -> DayStats:
    """Per table (`tables`, with `distinct_so_far`: ids seen up to this day), and over the tables
    whose ids churn (the headline fields)."""
    stats = DayStats(day, rows)
    totals = {"distinct": 0, "new": 0, "new_lookups": 0, "lookups": 0, "singletons": 0}
    for f, pieces in drawn.items():
        ids = np.concatenate(pieces) if pieces else np.zeros(0, np.uint64)
        t = _table_stats(ids, seen[f])
        seen[f] = np.union1d(seen[f], ids)
        t["distinct_so_far"] = int(len(seen[f]))
        t["churns"] = f in churning
        stats.tables[f"C{f + 1}"] = t
        if f not in churning:
            continue
        for key in totals:
            totals[key] += t[key]
    stats.distinct = totals["distinct"]
    if totals["distinct"]:
        stats.new_distinct_share = totals["new"] / totals["distinct"]
        stats.singleton_share = totals["singletons"] / totals["distinct"]
    if totals["lookups"]:
        stats.new_traffic_share = totals["new_lookups"] / totals["lookups"]
    return stats
