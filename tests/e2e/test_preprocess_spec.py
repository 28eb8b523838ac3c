"""`shardrec preprocess --spec` end to end: MovieLens- and Avazu-shaped logs (synth --like) with the
spec `spec infer` proposes, checked row by row against plain Python; Criteo's shape as a spec file;
bad rows and bad specs as one line."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from dataset_writing import old_layout_files
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.integrity import verify
from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.spec.feature_spec import CategoricalColumn, DenseColumn, ListColumn
from shardrec.dataloader.spec.spec_file import load_spec
from shardrec.embeddings.tables import build_table_configs
from shardrec.sharding.planner import pooling_factors
from shardrec.sharding.search.request import DatasetStatistics
from shardrec.tools.preprocess.ids.id_maps import hash_bytes, hash_ids
from shardrec.tools.preprocess.parse.criteo_text import transform_dense


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """like -> (log, the spec `spec infer` proposed for it)."""
    root = tmp_path_factory.mktemp("logs")
    out = {}
    for like, label in (("movielens", "rating>=4"), ("avazu", "click")):
        cli("synth", root / like, "--like", like, "--rows", "3000", "--seed", "2")
        log, spec = root / like / "train.csv", root / f"{like}.toml"
        cli("spec", "infer", log, "--label", label, "--out", spec)
        out[like] = (log, spec)
    return out


def _id(text: str, column: CategoricalColumn, rows: int) -> int:
    value = (
        hash_bytes(text.encode())
        if column.kind == "string"
        else int(text, 16 if column.kind == "hex" else 10)
    )
    return int(hash_ids(np.array([value & (2**64 - 1)], np.uint64), np.zeros(1, bool), rows)[0])


def _reference(log: Path, spec_path: Path, manifest: Manifest) -> list[tuple]:
    """(label, dense values, {feature: ids}) of every row, read by the csv module and hashed in
    Python."""
    spec = load_spec(spec_path)
    cards = {f.name: f.cardinality for f in manifest.sparse_features}
    out = []
    with open(log, newline="") as f:
        for row in csv.DictReader(f):
            label = (
                int(float(row[spec.label.name]) >= spec.label.threshold)
                if spec.label.threshold
                else int(row[spec.label.name])
            )
            dense = [
                transform_dense(
                    np.array([float(row[d.name] or 0)]), np.array([row[d.name] == ""]), d.transform
                )[0]
                for d in spec.dense
            ]
            ids = {}
            for c in spec.sparse:
                text = row[c.name]
                if isinstance(c, ListColumn):
                    ids[c.name] = [_id(v, c, cards[c.name]) for v in text.split(c.separator) if v][
                        : c.max_length
                    ]
                else:
                    ids[c.name] = [_id(text, c, cards[c.name]) if text else 0]
            out.append((label, dense, ids))
    return out


def _rows(directory: Path, manifest: Manifest) -> list[tuple]:
    out = []
    for split in ("train", "val", "test"):
        for part in open_split(directory, split, manifest):
            for r in range(part.rows):
                ids = {}
                for f in manifest.sparse_features:
                    if f.multi_hot:
                        off = part.offsets[f.name]
                        ids[f.name] = part.sparse[f.name][off[r] : off[r + 1]].tolist()
                    else:
                        ids[f.name] = [int(part.sparse[f.name][r])]
                out.append((int(part.labels[r]), part.dense[r].tolist(), ids))
    return out


@pytest.mark.parametrize("like", ["movielens", "avazu"])
def test_an_inferred_spec_preprocesses_the_log_as_python_reads_it(
    logs, like: str, tmp_path: Path
) -> None:
    log, spec = logs[like]
    out = tmp_path / "data"
    res = json.loads(
        cli("preprocess", log, "--spec", spec, "--out", out, "--chunk-mb", "0.1", "--json").stdout
    )
    assert res["complete"] and res["rows_skipped"] == {} and sum(res["rows_kept"].values()) == 3000
    assert verify(out) == []
    manifest = Manifest.load(out)
    assert manifest.options["spec"] == load_spec(spec).to_dict()
    got, want = _rows(out, manifest), _reference(log, spec, manifest)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[2] for g in got] == [w[2] for w in want]
    assert np.allclose([g[1] for g in got], [w[1] for w in want], rtol=1e-6)
    names = manifest.feature_names + manifest.dense_features
    head = [
        line.split("│")[1].strip()
        for line in cli("data", "head", out, "-n", "1").stdout.splitlines()
        if "│" in line
    ]
    if like == "movielens":
        assert manifest.schema_version == 3 and manifest.feature("genres").multi_hot
        assert 1.5 < manifest.feature("genres").stats["mean_ids_per_sample"] < 2.5
        assert "title" in names and "rating" not in names
        assert head == [
            "user_id", "movie_id", "label: rating >= 4", "gender", "age", "occupation", "zip", "title",
            "genres (list, sum)",
        ]  # fmt: skip
        # The planner's statistics carry the measured pooling of the list (the one-hots pool 1).
        configs = build_table_configs(manifest, 8)
        pooling = pooling_factors(configs, DatasetStatistics.from_manifest(manifest).stats, {})
        assert pooling["t_genres"] == manifest.feature("genres").stats["mean_ids_per_sample"]
        assert pooling["t_title"] == 1.0
    else:
        assert manifest.schema_version == 3 and "id" not in names and "click" not in names
        assert {"site_id", "C20", "hour"} <= set(names)
        assert head[:4] == ["label: click", "hour", "C1", "banner_pos"]


# Digests of the datasets preprocess writes from the `logs` fixture's files (hashing, several pieces
# of text), taken from the spec parser as it was before its fused fast paths: a change that moves
# any byte of a spec dataset (labels, dense values, ids, list offsets) fails here. (MovieLens' was
# taken again when spec infer began to leave its timestamp out, Avazu's when it began to make
# C14-C21 string categoricals: the old parser, 22d167a^, gives the same; both again when it began
# to raise the hash sizes of columns of few values to sizes that give each value its own id: with
# the sizes it proposed before, the parser gives the digests before.) Taken over the `.npy` files
# of the layout before one file per part; since, over each column as that layout held it
# (dataset_writing.old_layout_files): the same digests, the same rows. PINNED_PARTS: the part files.
PINNED_FILES = {
    "movielens": "30d4e4befbbea7018607ee46254c9968ce425ee4753f0b223088a2e864136cec",
    "avazu": "82294db7f0fa1c1aa0afa26a81452a718d376bd48bca31c7d3b502cc85bdfb01",
}
PINNED_PARTS = {
    "movielens": "74201fb526008fd2369e56c9d72c03a664070051963c039c27abdf88aa72c9ef",
    "avazu": "b5c4e2cf348560c9074b83bc905addb94183dd3ab6f568861ff3de94758ca406",
}


@pytest.mark.parametrize("like", ["movielens", "avazu"])
def test_a_spec_dataset_keeps_its_bytes(logs, like: str, tmp_path: Path) -> None:
    log, spec = logs[like]
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d", "--chunk-mb", "0.05")
    columns = old_layout_files(tmp_path / "d")
    sha = [f"{f}:{hashlib.sha256(columns[f]).hexdigest()}\n" for f in sorted(columns)]
    assert hashlib.sha256("".join(sha).encode()).hexdigest() == PINNED_FILES[like]
    parts = sorted(
        p.relative_to(tmp_path / "d").as_posix() for p in (tmp_path / "d").rglob("*.arrow")
    )
    sha = [f"{f}:{hashlib.sha256((tmp_path / 'd' / f).read_bytes()).hexdigest()}\n" for f in parts]
    assert hashlib.sha256("".join(sha).encode()).hexdigest() == PINNED_PARTS[like]


def _same_parts(a: Path, b: Path) -> None:
    first, second = Manifest.load(a), Manifest.load(b)
    assert [f.cardinality for f in first.sparse_features] == [
        f.cardinality for f in second.sparse_features
    ]
    for split in ("train", "val", "test"):
        assert [(p.bytes, p.sha256) for p in first.splits[split].parts] == [
            (p.bytes, p.sha256) for p in second.splits[split].parts
        ]


def test_criteos_shape_as_a_spec_file_writes_the_default_columns(tmp_path: Path) -> None:
    # `spec show` gives the table sizes --max-ids applied as hash_size: its spec alone, without
    # --max-ids again, makes the same parts (it used to print no hash_size, and the rebuild made
    # tables of 10,000,000 rows and other ids, without a word).
    cli("synth", tmp_path / "raw", "--rows", "1500", "--seed", "4", "--max-vocab", "300")
    cli("preprocess", tmp_path / "raw", "--out", tmp_path / "default", "--max-ids", "500")
    spec = tmp_path / "criteo.toml"
    spec.write_text(cli("spec", "show", tmp_path / "default").stdout)
    assert load_spec(spec).sparse[0] == CategoricalColumn("C1", kind="hex", hash_size=500)
    assert load_spec(spec).dense[1] == DenseColumn("I2")
    assert not spec.read_text().startswith("#")  # no option a spec cannot hold to name
    cli("preprocess", tmp_path / "raw", "--spec", spec, "--out", tmp_path / "spec")
    _same_parts(tmp_path / "default", tmp_path / "spec")
    from_spec = Manifest.load(tmp_path / "spec")
    assert (
        "spec" not in Manifest.load(tmp_path / "default").options
        and from_spec.options["spec_sha256"] == load_spec(spec).sha256()
    )


def test_a_spec_without_hash_sizes_comes_back_with_those_max_ids_gave(logs, tmp_path: Path) -> None:
    log, inferred = logs["avazu"]
    spec = tmp_path / "no_sizes.toml"
    spec.write_text(
        "".join(line for line in inferred.read_text().splitlines(True) if "hash_size" not in line)
    )
    assert all(c.hash_size is None for c in load_spec(spec).sparse)
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "a", "--max-ids", "5000")
    shown = tmp_path / "shown.toml"
    shown.write_text(cli("spec", "show", tmp_path / "a").stdout)
    assert {c.hash_size for c in load_spec(shown).sparse} == {5000}
    cli("preprocess", log, "--spec", shown, "--out", tmp_path / "b")
    _same_parts(tmp_path / "a", tmp_path / "b")


def test_spec_show_names_the_options_a_spec_cannot_hold(logs, tmp_path: Path) -> None:
    # Vocabulary mode, raw ids, float16 dense values, the chunk size (the parts' cut) and the
    # validation half change the bytes but have no key in a spec: a comment names their flags.
    log, spec = logs["avazu"]
    sparse = [c.name for c in load_spec(spec).sparse]
    runs = {
        "vocab": ["--min-count", "2", "--val-half", "second", "--float16", "--chunk-mb", "0.05"],
        "raw": ["--raw-ids", f"{sparse[0]},{sparse[2]}", "--max-ids", "3000"],
    }
    for name, flags in runs.items():
        cli("preprocess", log, "--spec", spec, "--out", tmp_path / name, *flags)
        shown = cli("spec", "show", tmp_path / name).stdout
        comment = [line for line in shown.splitlines() if line.startswith("#")]
        repeat = [f for f in flags if f != "--max-ids" and f != "3000"]
        assert comment[-1] == "#   " + " ".join(repeat), shown
        (tmp_path / f"{name}.toml").write_text(shown)
        again = tmp_path / f"{name}-again"
        cli("preprocess", log, "--spec", tmp_path / f"{name}.toml", "--out", again, *repeat)
        _same_parts(tmp_path / name, again)


def test_a_bad_row_names_file_line_column_and_value(logs, tmp_path: Path) -> None:
    log, spec = logs["movielens"]
    lines = log.read_text().splitlines(keepends=True)
    user, movie, rating, rest = lines[7].split(",", 3)  # the rating, third field, gets an x
    lines[7] = f"{user},{movie},x{rating},{rest}"
    bad = tmp_path / "bad.csv"
    bad.write_text("".join(lines))
    res = json.loads(
        cli("preprocess", bad, "--spec", spec, "--out", tmp_path / "a", "--json").stdout
    )
    assert res["rows_skipped"] == {"bad_label": 1}
    assert res["first_errors"] == [f"{bad}:8: rating: 'x{rating}' (bad_label)"]
    strict = cli("preprocess", bad, "--spec", spec, "--out", tmp_path / "b", "--strict", ok=False)
    assert_one_line_error(
        strict,
        rf"^error: {bad}:8: rating: 'x\d' \(bad_label\); the label column rating reads numbers "
        r"and is never missing: correct the row or leave out --strict to skip such rows \(up to "
        r"--max-skipped-fraction of them\)$",
    )


@pytest.mark.parametrize(
    ("edit", "flags", "message"),
    [
        (
            ('separator = "|"', 'seperator = "|"'),
            [],
            r"columns\[9\] \(genres\): unknown key 'seperator'; did you mean separator\?",
        ),
        (
            ('name = "zip"', 'name = "zipcode"'),
            [],
            r"train.csv: the header has no column 'zipcode' that .*; did you mean zip\?",
        ),
        (
            (),
            ["--num-dense", "3"],
            r"--num-dense: .*movielens.toml describes the columns and their format; set it there",
        ),
    ],
)
def test_a_spec_that_cannot_be_used_is_one_line(logs, tmp_path: Path, edit, flags, message) -> None:
    log, spec = logs["movielens"]
    edited = tmp_path / "movielens.toml"
    edited.write_text(spec.read_text().replace(*edit) if edit else spec.read_text())
    result = cli("preprocess", log, "--spec", edited, "--out", tmp_path / "d", *flags, ok=False)
    assert_one_line_error(result, message)


def test_vocabulary_mode_maps_list_values_too(logs, tmp_path: Path) -> None:
    log, spec = logs["movielens"]
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "v", "--min-count", "2")
    manifest = Manifest.load(tmp_path / "v")
    genres = manifest.feature("genres")
    assert genres.multi_hot and 10 < genres.cardinality <= 20  # 18 genres seen, + missing and OOV
    ids = np.concatenate(
        [p.sparse["genres"] for p in open_split(tmp_path / "v", "train", manifest)]
    )
    assert ids.min() >= 2 and ids.max() < genres.cardinality


def test_list_features_arrive_as_jagged_batches_with_their_lengths(tmp_path: Path) -> None:
    from shardrec.dataloader.digest import stream_digests
    from shardrec.dataloader.loader import NO_SHUFFLE, ShuffleSpec, build_loader

    rng = np.random.default_rng(0)
    tags = ["", "a", "a;b", "b;c;d;e;f", ";;a;", "c"]
    rows = [
        f"{rng.integers(0, 2)}\t{rng.integers(0, 9)}\t{tags[i % len(tags)]}\n" for i in range(700)
    ]
    (tmp_path / "log.tsv").write_text("".join(rows))
    (tmp_path / "s.toml").write_text(
        '[format]\nkind = "tsv"\n[[columns]]\nname = "y"\nrole = "label"\n[[columns]]\nname = "n"\nrole = "dense"\n'
        '[[columns]]\nname = "tags"\nrole = "list"\nseparator = ";"\nmax_length = 3\npooling = "mean"\nhash_size = 50\n'
    )
    cli("preprocess", tmp_path / "log.tsv", "--spec", tmp_path / "s.toml", "--out", tmp_path / "d")
    manifest = Manifest.load(tmp_path / "d")
    assert manifest.feature("tags").pooling == "mean" and manifest.schema_version == 3
    (loader,) = [
        build_loader(
            tmp_path / "d", "train", global_batch_size=60, rank=0, world_size=1, shuffle=NO_SHUFFLE
        )
    ]
    jt = loader.batch(0).sparse_features["tags"]
    assert jt.lengths().tolist() == [[0, 1, 2, 3, 1, 1][i % 6] for i in range(60)]
    assert jt.values().tolist()[:3] == [_id("a", ListColumn("tags"), 50)] * 2 + [
        _id("b", ListColumn("tags"), 50)
    ]

    def digests(world_size: int) -> list[str]:
        mix = ShuffleSpec(seed=1)
        loaders = [
            build_loader(
                tmp_path / "d",
                "train",
                global_batch_size=60,
                rank=r,
                world_size=world_size,
                shuffle=mix,
            )
            for r in range(world_size)
        ]
        return [d for _, d in stream_digests(loaders, 0, 9)]

    assert digests(1) == digests(2) == digests(3) and len(set(digests(1))) == 9


@pytest.mark.parametrize("mode", [[], ["--min-count", "2"]])
def test_raw_rows_read_by_the_datasets_spec_get_the_preprocessed_inputs(
    logs, tmp_path: Path, mode
) -> None:
    from shardrec.tools.preprocess.raw_rows import RawRows

    log, spec = logs["movielens"]
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d", "--layout", "kaggle", *mode)
    manifest = Manifest.load(tmp_path / "d")
    vocab = tmp_path / "d" / ".work" / "vocab"
    transform = {
        **manifest.options,
        "cardinalities": [f.cardinality for f in manifest.sparse_features],
        "vocab_dir": str(vocab) if vocab.is_dir() else None,
    }
    rows = RawRows({"transform": transform, "feature_names": manifest.feature_names})
    batches = list(rows.read(log, chunk_bytes=50_000))
    dense = np.concatenate([b[0][0] for b in batches])
    stored = _rows(tmp_path / "d", manifest)
    assert np.array_equal(dense, np.array([s[1] for s in stored], np.float32))
    assert np.concatenate([b[1] for b in batches]).tolist() == [s[0] for s in stored]
    for name in manifest.feature_names:
        values = np.concatenate([b[0][1][name][0] for b in batches]).tolist()
        lengths = np.concatenate([b[0][1][name][1] for b in batches]).tolist()
        assert values == [i for s in stored for i in s[2][name]]
        assert lengths == [len(s[2][name]) for s in stored]


def test_raw_rows_without_a_spec_or_schema_to_read_them_by_are_refused_in_one_line() -> None:
    from shardrec.tools.preprocess.raw_rows import RawRows

    transform = {"mode": "hash", "dataset": "/data/ml", "cardinalities": [10]}
    with pytest.raises(
        ValueError,
        match=r"^the model of /data/ml: cannot read raw rows: its training data records neither a "
        r"feature spec nor Criteo's text schema .*; score a preprocessed split of such data instead",
    ):
        RawRows({"transform": transform, "feature_names": ["genres"]})


def test_a_rerun_after_fixing_the_spec_writes_into_the_same_out(logs, tmp_path: Path) -> None:
    """A spec refused against the header leaves no run record behind: the user fixes it and reruns
    the same command, and is not told that the directory holds a run made with another spec."""
    log, spec = logs["movielens"]
    edited = tmp_path / "movielens.toml"
    edited.write_text(spec.read_text().replace('name = "zip"', 'name = "zipcode"'))
    out = tmp_path / "d"
    assert_one_line_error(
        cli("preprocess", log, "--spec", edited, "--out", out, ok=False), "zipcode"
    )
    edited.write_text(spec.read_text())
    cli("preprocess", log, "--spec", edited, "--out", out)
    assert Manifest.load(out).splits["train"].rows > 0
