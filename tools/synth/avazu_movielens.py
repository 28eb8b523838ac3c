"""Synthetic click logs shaped like Avazu's and MovieLens-1M's, with a hidden model of the label.

`shardrec synth --like avazu|movielens` writes them (criteo is criteo.py's own format), so that a
feature spec, preprocessing and training can be tried and tested without a download. The quirks
are the real files' (see the README's "Your own data"):

- avazu: CSV with a header; a 20-digit `id` per row (to ignore); the label `click` second; `hour`
  as YYMMDDHH; 8-character hex categoricals (site, app, device) and decimal ones, C20 mostly -1.
- movielens: the ratings joined with users and movies, CSV with a header; titles in quotes with
  commas (`"American President, The (1995)"`) and now and then a quote inside; gender and zip
  strings (some zips empty, some ZIP+4); `Comedy|Drama` genre lists; a 1-5 rating, 4 or more
  when the hidden model clicks.

Labels follow a logistic model of a few columns (the others are noise), so a model that learns
gets a clearly better AUC than 0.5. Rows are assembled as byte matrices (criteo.py's approach):
each column's distinct values are rendered once, then gathered per row; no per-row Python.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from shardrec.dataloader.util.files import atomic_path
from shardrec.tools.synth.criteo import int_bytes, open_out

_PAD = 0
LIKE = ("criteo", "avazu", "movielens")
_GENRES = [
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    # fmt: skip
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
]
_WORDS = [
    "Story",
    "Night",
    "American",
    "President",
    "Heat",
    "Money",
    "Dead",
    "City",
    "Love",
    "Big",
    "Lost",
    "Man",
]


def _table(values: list[str]) -> np.ndarray:
    """Each value's UTF-8 bytes as a row of a [len(values), width] matrix, _PAD after its end."""
    data = [v.encode() for v in values]
    out = np.full((len(data), max(1, *(len(d) for d in data))), _PAD, np.uint8)
    for i, d in enumerate(data):
        out[i, : len(d)] = np.frombuffer(d, np.uint8)
    return out


def _csv_field(value: str) -> str:
    """A value as a CSV writer quotes it (only when it holds a comma, a quote or a newline)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([value])
    return out.getvalue()


def _zipf(rng: np.random.Generator, n: int, vocab: int, a: float) -> np.ndarray:
    cdf = np.cumsum(1.0 / np.arange(1, vocab + 1) ** a)
    return np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(n)), vocab - 1)


def _rows(columns: list[np.ndarray], delimiter: str = ",") -> bytes:
    """Rows of text from per-column byte matrices [n, width] (_PAD where no character)."""
    n = len(columns[0])
    sep = np.full((n, 1), ord(delimiter), np.uint8)
    parts = []
    for c in columns:
        parts += [c, sep]
    parts[-1] = np.full((n, 1), ord("\n"), np.uint8)
    matrix = np.concatenate(parts, axis=1)
    return matrix[matrix != _PAD].tobytes()


def _ints(values: np.ndarray) -> np.ndarray:
    return int_bytes(values.astype(np.int64), np.zeros(len(values), bool), False)


def _hex_vocab(rng: np.random.Generator, size: int) -> list[str]:
    return [f"{v:08x}" for v in rng.integers(0, 2**32, size)]


def _avazu_chunk(rng: np.random.Generator, world: dict, n: int, first_id: int) -> bytes:
    scrambled = np.arange(first_id, first_id + n, dtype=np.uint64) * np.uint64(
        0x9E3779B97F4A7C15
    )  # wraps
    ids = np.uint64(10**19) + scrambled % np.uint64(8 * 10**18)  # 20 digits, as Avazu's
    digits = (
        ids[:, None] // (np.uint64(10) ** np.arange(19, -1, -1, dtype=np.uint64))
    ) % np.uint64(10)
    columns = [(digits + np.uint64(48)).astype(np.uint8)]
    logit = np.full(n, -1.6)
    drawn = {}
    for name, (table, weights, a) in world["columns"].items():
        ranks = _zipf(rng, n, len(table), a)
        drawn[name] = table[ranks]
        logit += weights[ranks]
    hour = world["hours"][rng.integers(0, len(world["hours"]), n)]
    logit += world["hour_weight"][hour % 100]
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    columns += [_ints(click), _ints(hour)]
    columns += [drawn[name] for name in world["columns"]]
    return _rows(columns)


AVAZU_HEADER = (
    "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
    "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21"
)


def _avazu_world(seed: int) -> dict:
    rng = np.random.default_rng([seed, 0xA7A2])
    ints = lambda values: [str(v) for v in values]  # noqa: E731
    vocab = {
        "C1": ints([1005, 1002, 1010, 1012, 1007, 1001, 1008]),
        "banner_pos": ints([0, 1, 7, 2, 4, 5, 3]),
        "site_id": _hex_vocab(rng, 3000), "site_domain": _hex_vocab(rng, 2500), "site_category": _hex_vocab(rng, 22),
        "app_id": _hex_vocab(rng, 4000), "app_domain": _hex_vocab(rng, 250), "app_category": _hex_vocab(rng, 30),
        "device_id": _hex_vocab(rng, 20000), "device_ip": _hex_vocab(rng, 50000), "device_model": _hex_vocab(rng, 5000),
        "device_type": ints([1, 0, 4, 5, 2]), "device_conn_type": ints([0, 2, 3, 5]),
        "C14": ints(rng.integers(375, 24052, 2500)), "C15": ints([320, 300, 216, 728, 120, 1024, 480, 768]),
        "C16": ints([50, 250, 36, 480, 90, 20, 768, 1024, 320]), "C17": ints(rng.integers(112, 2758, 430)),
        "C18": ints([0, 3, 2, 1]), "C19": ints(rng.integers(33, 1959, 68)),
        "C20": ints([-1, *rng.integers(100000, 100249, 170)]), "C21": ints(rng.integers(1, 220, 60)),
    }  # fmt: skip
    informative = {
        "C1",
        "banner_pos",
        "site_id",
        "app_id",
        "app_category",
        "device_model",
        "C14",
        "C18",
        "C21",
    }
    columns = {
        name: (
            _table(values),
            rng.normal(0, 0.8 if name in informative else 0.0, len(values)),
            rng.uniform(1.1, 1.6),
        )
        for name, values in vocab.items()
    }
    hours = np.array([14102100 + day * 100 + h for day in range(10) for h in range(24)], np.int64)
    return {"columns": columns, "hours": hours, "hour_weight": rng.normal(0, 0.3, 24)}


def _movielens_world(seed: int) -> dict:
    rng = np.random.default_rng([seed, 0x3115])
    users, movies = 6040, 3883
    zips = [f"{z:05d}" for z in rng.integers(1000, 99999, users)]
    for i in rng.choice(users, users // 30, replace=False):
        zips[i] = f"{zips[i]}-{rng.integers(0, 9999):04d}"
    for i in rng.choice(users, users // 50, replace=False):
        zips[i] = ""
    titles, genres = [], []
    for m in range(movies):
        name = " ".join(rng.choice(_WORDS, rng.integers(1, 4)))
        if m % 7 == 0:
            name = f"{name}, The"  # "American President, The (1995)": a comma inside a quoted field
        if m % 97 == 0:
            name = f'{name} "Redux"'  # a quote inside: written as "" within the quotes
        titles.append(_csv_field(f"{name} ({rng.integers(1919, 2001)})"))
        genres.append("|".join(rng.choice(_GENRES, rng.integers(1, 4), replace=False)))
    ages = np.array([1, 18, 25, 35, 45, 50, 56])
    user_cols = {
        "gender": _table([str(g) for g in rng.choice(["M", "F"], users, p=[0.72, 0.28])]),
        "age": _table([str(a) for a in rng.choice(ages, users)]),
        "occupation": _table([str(o) for o in rng.integers(0, 21, users)]),
        "zip": _table(zips),
    }
    genre_weight = rng.normal(0, 0.7, len(_GENRES))
    movie_weight = np.array(
        [sum(genre_weight[_GENRES.index(g)] for g in gs.split("|")) for gs in genres]
    )
    return {
        "user_ids": _table([str(u) for u in range(1, users + 1)]),
        "movie_ids": _table([str(m) for m in range(1, movies + 1)]),
        "user_cols": user_cols,
        "titles": _table(titles),
        "genres": _table(genres),
        "user_weight": rng.normal(0, 0.8, users),
        "movie_weight": movie_weight + rng.normal(0, 0.5, movies),
        "gender_weight": rng.normal(0, 0.3, users),
    }


MOVIELENS_HEADER = "user_id,movie_id,rating,timestamp,gender,age,occupation,zip,title,genres"


def _movielens_chunk(rng: np.random.Generator, world: dict, n: int, first: int) -> bytes:
    user = _zipf(rng, n, len(world["user_ids"]), 1.05)
    movie = _zipf(rng, n, len(world["movie_ids"]), 1.2)
    logit = (
        world["user_weight"][user]
        + world["movie_weight"][movie]
        + world["gender_weight"][user]
        - 0.6
    )
    click = rng.random(n) < 1 / (1 + np.exp(-logit))
    rating = np.where(click, rng.integers(4, 6, n), rng.integers(1, 4, n))
    timestamp = 956703932 + (first + np.arange(n)) * 7 + rng.integers(0, 7, n)
    u = world["user_cols"]
    columns = [world["user_ids"][user], world["movie_ids"][movie], _ints(rating), _ints(timestamp)]
    columns += [u[name][user] for name in ("gender", "age", "occupation", "zip")]
    columns += [world["titles"][movie], world["genres"][movie]]
    return _rows(columns)


_CHUNK_ROWS = 1 << 16


def write_like(path: Path, like: str, rows: int, seed: int, gzip_level: int | None = None) -> int:
    """Write `rows` rows shaped like `like` (avazu or movielens) with a header; returns the text
    bytes.

    The file appears only when complete (written under a temporary name, then renamed).
    """
    world, chunk, header = {
        "avazu": (_avazu_world, _avazu_chunk, AVAZU_HEADER),
        "movielens": (_movielens_world, _movielens_chunk, MOVIELENS_HEADER),
    }[like]
    state = world(seed)
    rng = np.random.default_rng([seed, 1])
    written = 0
    with (
        atomic_path(path, fsync=False) as tmp,
        open_out(tmp, path.suffix == ".gz", gzip_level, name=path.name) as out,
    ):
        written += out.write(f"{header}\n".encode())
        for start in range(0, rows, _CHUNK_ROWS):
            written += out.write(chunk(rng, state, min(_CHUNK_ROWS, rows - start), start))
    return written
