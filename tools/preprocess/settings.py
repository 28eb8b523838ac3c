"""The settings of one preprocessing run (`PreprocessConfig`): the one home of their defaults and
help (`shardrec preprocess --help` shows each field's docstring), and what a rerun must match: the
record of the run in --out (check_fingerprint), and the files a killed run left
(remove_temporaries)."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from shardrec.dataloader.format.manifest import MANIFEST, SPLITS
from shardrec.dataloader.spec.feature_spec import MAX_HASH_SIZE
from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.dataloader.util.locks import DATASET_LOCK, WORK_DIR
from shardrec.dataloader.util.near import did_you_mean, name_list
from shardrec.tools.preprocess.ids.vocab import DEFAULT_MEMORY_MB
from shardrec.tools.preprocess.inputs import LAYOUTS, InputNames, resolve_layout
from shardrec.tools.preprocess.parse.criteo_text import DENSE_TRANSFORMS, Schema
from shardrec.tools.preprocess.text.file_identity import (
    as_recorded,
    file_identity,
    input_difference,
)

if TYPE_CHECKING:
    from shardrec.dataloader.spec.feature_spec import FeatureSpec

logger = logging.getLogger(__name__)

RUN_RECORD = "run.json"
"""In WORK_DIR: the settings and inputs of the run there (PreprocessConfig.fingerprint)."""
REFUSED = "refused"
"""In WORK_DIR: the run there ended in a refusal of its input (mark_refused)."""

RAW_VALUES = 2**63
"""The bound of a sequence's integers kept as written (timestamps, action codes): uint64 ids."""


@dataclass
class PreprocessConfig:
    """Every option of a preprocessing run (the CLI fills it; defaults live here)."""

    inputs: list[Path]
    """Click logs: Kaggle train.txt, 1TB day files (.gz too), directories of them, or the CSV, TSV
    or Parquet files a spec describes."""
    out: Path
    """Output dataset directory."""
    max_ids: list[int] = field(default_factory=lambda: [10_000_000])
    """Hashing mode: table rows per feature (N, or N1,N2,... one per feature)."""
    min_count: int = 0
    """Vocabulary mode when > 0: keep values seen at least K times in training days."""
    raw_ids: list[str] = field(default_factory=list)
    """Features kept as raw 64-bit ids, no modulo (names, e.g. C3,C12, or all), for managed tables:
    integers as they are, hex as decoded, strings by the spec path's 64-bit hash (hashing mode
    only)."""
    vocab_memory_mb: float = DEFAULT_MEMORY_MB
    """Vocabulary mode: MiB of (value, count) pairs one process holds while counting (per worker) or
    merging; more is spilled to sorted runs on disk and merged in value ranges."""
    layout: str = "auto"
    """auto, kaggle (7 pseudo-days) or days (one file per day, last halved)."""
    val_half: str = "first"
    """Which half of the last day is validation: first (torchrec's choice) or second."""
    schema: Schema = field(default_factory=Schema)
    """Columns and delimiter of the text."""
    dense_transform: str = "log1p"
    """How dense integers become model inputs: one of log1p, signed-log1p, shift-log1p, none."""
    dense_dtype: str = "float32"
    """Dense values stored as float32 or float16."""
    workers: int = 1
    """Worker processes."""
    chunk_mb: float = 128
    """MiB of text per task and per output part; bounds memory per worker."""
    strict: bool = False
    """Stop at the first malformed row (exit 1) instead of skipping it."""
    max_skipped_fraction: float = 0.003
    """Most malformed rows to skip, as a share of all lines and of each input file's (0.003: 0.3%;
    Criteo's logs have next to none); more, no row kept, or a split left without rows is an error
    and no manifest is written. More: finished tasks are kept, rerun with a higher value to accept;
    the others, which no value accepts: the run leaves nothing behind."""
    spec: FeatureSpec | None = None
    """A feature spec (a TOML file): the input's format (CSV, TSV or Parquet) and each column's
    role; `shardrec spec infer` proposes one. Default: Criteo's rows, as the schema options
    (num_dense, delimiter, ...) describe them."""
    spec_file: str = ""
    """The spec's file, named in messages."""
    part: tuple[int, int] | None = None
    """i/n: this machine's share (tasks i, i+n, ...), e.g.
    $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT, into a shared --out; then one run without it
    writes the manifest. Vocabulary mode: run every part twice (count, then map)."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"{self.out}: exists and is not a directory")
        if self.val_half not in ("first", "second"):
            raise ValueError(f"val_half {self.val_half!r} must be first or second")
        if self.dense_transform not in DENSE_TRANSFORMS:
            raise ValueError(
                f"dense transform {self.dense_transform!r} is not one of {', '.join(DENSE_TRANSFORMS)}"
            )
        if self.dense_dtype not in ("float32", "float16"):
            raise ValueError(f"dense dtype {self.dense_dtype!r} must be float32 or float16")
        if self.spec is not None and (self.schema != Schema() or self.dense_transform != "log1p"):
            raise ValueError(
                f"the spec {self.spec_file} describes the columns: give no schema or dense transform too"
            )
        if len(self.max_ids) not in (1, self.num_sparse):
            raise ValueError(
                f"max_ids has {len(self.max_ids)} values; give 1 or one per sparse feature ({self.num_sparse})"
            )
        if self.raw_ids and self.min_count > 0:
            raise ValueError(
                "--raw-ids keeps ids as they are; --min-count numbers them by a vocabulary: "
                "give one or the other"
            )
        if self.min_count <= 0 and any(not 2 <= n <= MAX_HASH_SIZE for n in self.max_ids):
            raise ValueError(
                f"max_ids {self.max_ids} must all be 2 to 2^63 - 1 (id 0 is the missing value, "
                "ids are 64-bit)"
            )
        if self.vocab_memory_mb <= 0:
            raise ValueError(f"vocab_memory_mb {self.vocab_memory_mb:g}: must be > 0")
        if self.workers < 1:
            raise ValueError(f"workers {self.workers}: must be >= 1")
        if self.chunk_mb <= 0:
            raise ValueError(f"chunk_mb {self.chunk_mb:g}: must be > 0")
        if not 0 <= self.max_skipped_fraction <= 1:
            raise ValueError(
                f"max_skipped_fraction {self.max_skipped_fraction:g}: must be in [0, 1]"
            )
        sequences = [c for c in (self.spec.sparse if self.spec else []) if c.role == "sequence"]
        if sequences and self.parquet:
            raise ValueError(
                f"{self.spec_file}: column {sequences[0].name!r}: sequence columns are read from "
                "CSV or TSV click logs; an event log in Parquet goes through `shardrec preprocess "
                '--events SPEC` (README, "Event logs")'
            )
        raw = [c for c in sequences if c.raw]
        if raw and self.min_count > 0:
            raise ValueError(
                f"--min-count: column {raw[0].name!r} keeps integers as written (values = "
                f'"{raw[0].values}"): vocabulary mode is for ids; preprocess without --min-count'
            )
        if self.part is not None and not (self.part[1] >= 1 and 0 <= self.part[0] < self.part[1]):
            raise ValueError(f"part {self.part[0]}/{self.part[1]} must satisfy 0 <= i < n")

    @property
    def num_sparse(self) -> int:
        return len(self.spec.sparse) if self.spec else self.schema.num_sparse

    @property
    def parquet(self) -> bool:
        """The inputs are Parquet files (the spec's format says so)."""
        return self.spec is not None and self.spec.format.kind == "parquet"

    @property
    def input_names(self) -> InputNames:
        """Which files of a directory input are read: the spec's pattern, its Parquet files, or
        Criteo's names in the rows' format."""
        if self.spec:
            kind = self.spec.format.kind
            return InputNames(kind == "csv", self.spec.format.files or "", kind == "parquet")
        return InputNames(self.schema.delimiter == ",")

    @property
    def header(self) -> bool:
        return self.spec.format.header if self.spec else self.schema.header

    def cardinalities(self, names: list[str] | None = None) -> tuple[int, ...]:
        """Hashing mode: table rows per sparse feature (a spec column's hash_size, else
        --max-ids); 0 for the features of `names` (every sparse feature, in order) that --raw-ids
        keeps raw. ValueError naming --raw-ids for a feature that is not there."""
        default = self.max_ids * self.num_sparse if len(self.max_ids) == 1 else self.max_ids
        if self.spec is not None:
            # A sequence of integers kept as written has no table: any value below 2^63.
            default = [
                RAW_VALUES if getattr(c, "raw", False) else c.hash_size or d
                for c, d in zip(self.spec.sparse, default)
            ]
        raw = set(self.raw_ids)
        if names is None or not raw:
            return tuple(default)
        if "all" in raw:  # of the features of ids (not a sequence's integers kept as written)
            raw = {n for n, c in zip(names, default) if c != RAW_VALUES}
        unknown = sorted(raw - set(names))
        if unknown:
            raise ValueError(
                f"--raw-ids {','.join(self.raw_ids)}: no sparse feature {unknown[0]!r} "
                f"(the features: {name_list(names)})"
                f"{did_you_mean(unknown[0], names)}"
            )
        return tuple(0 if n in raw else c for n, c in zip(names, default))

    def fingerprint(self, files: list[Path], for_rerun: bool = False) -> dict:
        """What fixes the output; a rerun into the same directory must match it.

        for_rerun: inputs are also identified by their modification time (ns) and a sampled
        digest of their content (file_identity), so that a rerun after an input was replaced by
        one of the same size (and time) does not reuse the old outputs. Only the rerun check uses
        it: the manifest stays the same for a copy of the same inputs.
        """
        inputs = [
            file_identity(f) if for_rerun else {"name": f.name, "bytes": f.stat().st_size}
            for f in files
        ]
        return {
            "inputs": inputs,
            "mode": "vocab" if self.min_count > 0 else "hash",
            "max_ids": list(self.cardinalities()) if self.min_count <= 0 else None,
            "min_count": self.min_count if self.min_count > 0 else None,
            # Only when given: the datasets of today keep their manifests' bytes.
            **({"raw_ids": list(self.raw_ids)} if self.raw_ids else {}),
            "layout": self.layout,
            "val_half": self.val_half,
            **(
                {"schema": asdict(self.schema), "dense_transform": self.dense_transform}
                if self.spec is None
                else {"spec": self.spec.to_dict(), "spec_sha256": self.spec.sha256()}
            ),
            "dense_dtype": self.dense_dtype,
            "chunk_mb": self.chunk_mb,
        }


def flags_to_repeat(options: dict, spec: FeatureSpec | None = None) -> list[str]:
    """The settings of a run (a manifest's `options`) that change the dataset's bytes but that a
    spec cannot hold, as the flags that give them again (`shardrec spec show` names them beside
    the spec). spec: the one shown (spec_file.applied_spec); where it lacks a hashed feature's
    table size, --max-ids gives them all."""
    default = {f.name: f.default for f in fields(PreprocessConfig)}
    flags = []
    if options.get("mode") == "vocab" and options.get("min_count"):
        flags.append(f"--min-count {options['min_count']}")
    sizes = options.get("max_ids")
    unsized = spec is not None and any(
        c.hash_size is None and not getattr(c, "raw", False) for c in spec.sparse
    )
    if options.get("mode") != "vocab" and isinstance(sizes, list) and sizes and unsized:
        flags.append(f"--max-ids {','.join(map(str, sizes))}")
    if options.get("raw_ids"):
        flags.append(f"--raw-ids {','.join(options['raw_ids'])}")
    inputs = options.get("inputs")
    if isinstance(inputs, list) and inputs:  # the layout recorded is the one auto resolved to
        if options.get("layout") not in (None, resolve_layout("auto", inputs)):
            flags.append(f"--layout {options['layout']}")
    if options.get("val_half", default["val_half"]) != default["val_half"]:
        flags.append(f"--val-half {options['val_half']}")
    if options.get("dense_dtype") == "float16":
        flags.append("--float16")
    chunk_mb = options.get("chunk_mb", default["chunk_mb"])
    if isinstance(chunk_mb, int | float) and chunk_mb != default["chunk_mb"]:
        flags.append(f"--chunk-mb {chunk_mb:g}")
    return flags


def check_fingerprint(out: Path, fp: dict, part: bool = False) -> None:
    """Record the run in `out`, or check that a rerun is of the run recorded there; a rerun with
    other inputs or settings is refused (ValueError), unless the run there was refused for its
    input (mark_refused): then it starts over, as the corrected command is expected to. Not under
    --part (`part`): the machines start together, and each would remove the others' files."""
    path, refused = out / WORK_DIR / RUN_RECORD, out / WORK_DIR / REFUSED
    if path.is_file():
        try:
            old = json.loads(path.read_bytes())
        except (
            ValueError
        ) as e:  # torn or not JSON: the outputs beside it cannot be matched to a run
            raise ValueError(
                f"{path}: unreadable run record ({e}); remove the directory or choose another --out"
            ) from None
        old = old if isinstance(old, dict) else {}
        if old != fp and old == {**fp, "inputs": as_recorded(old.get("inputs"), fp["inputs"])}:
            # An older shardrec's record, without digests, of these very inputs: it gets them.
            atomic_write_bytes(path, json.dumps(fp, indent=1).encode())
        elif old != fp:
            diff = _settings_diff(old, fp)
            # A run killed or stopped keeps its finished tasks for the same command; they are of
            # no use to another, yet hours of work that a typo in its --out would throw away.
            if not refused.is_file():
                raise ValueError(
                    f"{out}: holds a run with different {diff}; remove the directory or choose "
                    "another --out"
                )
            if part:
                raise ValueError(
                    f"{out}: holds a run with different {diff}, refused for its input; remove the "
                    "directory, then start the --part runs (a --part run does not start it over: "
                    "the machines would remove each other's files)"
                )
            logger.warning(
                "%s: the run there was refused for its input, and this one has different %s: "
                "starting over",
                out,
                diff,
            )
            _remove_refused_run(out)
            atomic_write_bytes(path, json.dumps(fp, indent=1).encode())
        refused.unlink(missing_ok=True)  # this run resumes it: not refused until it is again
    else:
        # No record, but a dataset (or its parts) is there: its settings are unknown, and this run
        # would replace its files one by one.
        found = [out / MANIFEST] if (out / MANIFEST).is_file() else sorted(out.glob("*/part-*"))
        if found:
            raise ValueError(
                f"{out}: holds a dataset ({found[0].relative_to(out)}) but no record of the run "
                f"that wrote it ({WORK_DIR}/{RUN_RECORD}); remove the directory or choose another "
                "--out"
            )
        atomic_write_bytes(path, json.dumps(fp, indent=1).encode())


def mark_refused(out: Path) -> None:
    """Record that the run in `out` (its record written) was refused for its input: a malformed row
    under --strict, too many of them, a file that cannot be read, a value its part cannot store
    (UnstorableValueError: the fix it names, a spec or flag, is a rerun of other settings). The
    same command resumes it (with a higher --max-skipped-fraction: at once); one for a corrected
    input or spec starts over.
    A folder that holds a finished dataset is not marked: a rerun of its command refused by a lower
    --max-skipped-fraction leaves the dataset as good as it was, and another command must not wipe
    it."""
    if (out / WORK_DIR / RUN_RECORD).is_file() and not (out / MANIFEST).is_file():
        atomic_write_bytes(out / WORK_DIR / REFUSED, b"")


def _remove_refused_run(out: Path) -> None:
    """Remove what a preprocessing run writes in `out`: its parts, then its files in WORK_DIR but
    its lock and, last, its record (a run killed in between finds it and starts over again)."""
    for split in SPLITS:
        for part in (out / split).glob("part-*"):
            part.unlink()
        if (out / split).is_dir() and not any((out / split).iterdir()):
            (out / split).rmdir()
    for p in (out / WORK_DIR).iterdir():
        if p.name.startswith(DATASET_LOCK) or p.name in (RUN_RECORD, REFUSED):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _settings_diff(old: dict, new: dict) -> str:
    """The settings that differ between the folder's run record and this run, every key of
    either side: `raw_ids (all in the folder, not given now)`, a short value shown, a long one
    (inputs, max_ids) named only."""
    shown = []
    for key in sorted(old.keys() | new.keys()):
        if key in old and key in new:
            if old[key] == new[key]:
                continue
            if key == "inputs":  # long: the first that differs, in words
                shown.append(f"inputs ({input_difference(old[key], new[key])})")
                continue
            a, b = _setting_text(old[key]), _setting_text(new[key])
            short = len(a) + len(b) <= 40
            shown.append(f"{key} ({a} in the folder, {b} now)" if short else key)
        elif key in old:
            shown.append(f"{key} ({_setting_text(old[key])} in the folder, not given now)")
        else:
            shown.append(f"{key} (not in the folder's run, {_setting_text(new[key])} now)")
    return ", ".join(shown) or "settings"


def _setting_text(value: object) -> str:
    if value is None:
        return "not given"
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ",".join(str(v) for v in value)
    return str(value)


def remove_temporaries(out: Path) -> None:
    # Files a killed run left under temporary names; finished files are never named like this.
    for p in out.rglob(".*.tmp*"):
        if p.is_file():
            p.unlink()


def remove_run_output(out: Path, before: set[str] | None) -> None:
    """Remove what a refused run wrote under `out`: the folder itself where it was not there
    before (before: None), else each entry of it not among `before` (the names it held)."""
    if before is None:
        shutil.rmtree(out, ignore_errors=True)
        return
    for p in out.iterdir() if out.is_dir() else ():
        if p.name in before:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
