"""What `shardrec eval` evaluates, checked before any rank starts: the request, the run's config,
checkpoint and plan, and the data (the run's own, unchanged since training, or other data of its
schema). Torch-free: the CLI checks a request in one line without paying for torch; the ranks
(trainer.inference.evaluate) check it again.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, older_fingerprints
from shardrec.dataloader.format.manifest import Manifest
from shardrec.sharding.plan.plan_file import load_plan
from shardrec.trainer.distributed.devices import (
    check_ranks_fit,
    cuda_unusable_reason,
    resolve_device_kind,
)
from shardrec.trainer.job import data_options
from shardrec.trainer.job.config import JobConfig, load_job_config
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.folders import (
    misnamed_checkpoint_message,
    misnamed_checkpoints,
    misnamed_passed_over,
    other_step_checkpoints,
    other_step_message,
    other_step_read,
    torn_checkpoint,
    torn_checkpoint_message,
)
from shardrec.trainer.rundir.checkpoint.readable import READ_ANOTHER, unreadable_problem
from shardrec.trainer.rundir.checkpoint.trust import (
    UntrustedCheckpoint,
    complete_checkpoints,
    refused_with_advice,
    verify_checkpoint,
)
from shardrec.trainer.rundir.life import trained_data
from shardrec.trainer.rundir.life.stretches import earlier_stretch_of, read_stretches


@dataclass(frozen=True)
class EvalRequest:
    """Which checkpoint of which run to evaluate on which split; `shardrec eval` hands it to its
    ranks as one JSON file (to_json / from_json)."""

    run_dir: Path
    step: int | None = None
    """The checkpoint's step (None: the newest complete one)."""
    split: str = "test"
    """The dataset split to evaluate."""
    data: Path | None = None
    """Another dataset of the run's schema to evaluate on (None: the run's own, unchanged since
    training)."""
    device: str = "auto"
    """The device kind to evaluate on: auto (this host's: CUDA where torch can use it), cpu or
    cuda, whatever the run trained on (its checkpoint loads onto either)."""

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        return (
            json.dumps(
                {k: str(v) if isinstance(v, Path) else v for k, v in fields.items()}, indent=1
            )
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str) -> EvalRequest:
        raw = json.loads(text)
        data = raw.pop("data")
        return cls(
            run_dir=Path(raw.pop("run_dir")), data=Path(data) if data is not None else None, **raw
        )


def run_config(run_dir: Path) -> JobConfig:
    """The resolved config a run kept (RUN/config.toml); ValueError if there is none."""
    path = Path(run_dir) / names.CONFIG
    if not path.is_file():
        raise ValueError(names.no_run_file(run_dir, names.CONFIG))
    return load_job_config(path)


def run_dataset(
    run_dir: Path, config: JobConfig, data: Path | None = None, use: str = "evaluate"
) -> Manifest:
    """The manifest of the data to score the run's model on; ValueError (one line) when it is not
    found from here, or when it is not the data the run trained on, unless `data` names other data
    explicitly, which must then have the run's features and cardinalities (its schema). `use`:
    what the command does with the run ("evaluate", "export"), as its refusals say."""
    if data is not None:
        if not Path(data).is_dir():
            raise ValueError(
                f"--data {data}: not a directory"
                if Path(data).exists()
                else f"--data {data}: does not exist"
            )
        manifest = Manifest.load(data)
        _check_schema(run_dir, data, manifest)
        return manifest
    if not Path(config.data.path).is_dir():
        raise ValueError(
            f"{Path(run_dir) / names.CONFIG}: data.path = {config.data.path!r} is not a directory here "
            "(a relative path is taken from where the command runs; pass --data DIR)"
        )
    manifest = Manifest.load(config.data.path)
    record = trained_data.read_dataset_record(run_dir) or {}
    fingerprint = dataset_fingerprint(manifest)
    # The same check as a resume's: a run scored on changed data would report a figure of other
    # data.
    if record.get("fingerprint") and not trained_data.recorded_data(record, manifest):
        differs = trained_data.spec_differences(record, manifest)
        if differs:  # --data would refuse it too: other samples, not a later period
            raise ValueError(
                f"{run_dir} was trained on data of another event spec than {config.data.path} now "
                f"holds ({differs}): preprocess the log into {config.data.path} again with the "
                f"run's spec to {use} the run"
            )
        changed = (
            f"{run_dir} was trained on other data than {config.data.path} now holds (fingerprint "
            f"{str(record['fingerprint'])[:12]}; the data there is {fingerprint[:12]})"
        )
        unfit, _ = _schema_difference(run_dir, manifest)
        if unfit:  # --data would refuse it: only the run's data, or data of its schema, will do
            raise ValueError(
                f"{changed}, and --data {config.data.path} would be refused too ({unfit}): to "
                f"{use} the run, pass --data DIR naming the data it trained on (or other data of "
                "its features and cardinalities)"
            )
        raise ValueError(
            f"{changed}: to {use} on this data all the same, pass --data {config.data.path}"
        )
    return manifest


def stretch_data(run_dir: Path, step: int) -> Path | None:
    """The data the checkpoint of `step` trained on where it was taken in an earlier stretch of a
    run that went on (RUN/stretches.json), whose data is not the run's data.path; None for a
    checkpoint of the current stretch. ValueError (one line) when that data is not there or
    holds other data now: the run's data.path would be refused as another dataset."""
    stretch = earlier_stretch_of(read_stretches(run_dir), step)
    if stretch is None:
        return None
    taken = (
        f"checkpoint {step} was taken in the stretch on {stretch.data} "
        f"(steps {stretch.first_step}-{stretch.last_step})"
    )
    if not Path(stretch.data).is_dir():
        raise ValueError(
            f"{taken}, which is not a directory here: pass --data DIR, that data where it is now"
        )
    manifest = Manifest.load(stretch.data)
    if stretch.fingerprint not in (dataset_fingerprint(manifest), *older_fingerprints(manifest)):
        raise ValueError(
            f"{taken}, which holds other data now (fingerprint {stretch.fingerprint[:12]}; the data "
            f"there is {dataset_fingerprint(manifest)[:12]}): to use it all the same, pass "
            f"--data {stretch.data}"
        )
    return Path(stretch.data)


def with_stretch_data(request: EvalRequest) -> EvalRequest:
    """The request on the data its checkpoint trained on, where that is an earlier stretch's
    (stretch_data); an explicit --data is kept."""
    if request.data is not None:
        return request
    step, _ = find_checkpoint(request.run_dir, request.step)
    data = stretch_data(request.run_dir, step)
    return request if data is None else dataclasses.replace(request, data=data)


def _check_schema(run_dir: Path, data: Path, manifest: Manifest) -> None:
    """`data` has the features and cardinalities the run trained with (RUN/dataset.json's schema),
    and was preprocessed as the run's data was (same hashing or vocabulary, dense transform)."""
    unfit, fix = _schema_difference(run_dir, manifest)
    if unfit:
        raise ValueError(f"--data {data}: {unfit}{fix}")


def _schema_difference(run_dir: Path, manifest: Manifest) -> tuple[str, str]:
    """How the data of `manifest` differs from the schema and preprocessing the run trained with,
    and what to do about it ("", "" where it does not, or the run recorded neither)."""
    record = trained_data.read_dataset_record(run_dir) or {}
    saved = record.get("schema")
    if saved is None:  # a run from before schema records: the checkpoint's table check applies
        return "", ""
    differs, _ = trained_data.sparse_difference(
        saved["sparse"], trained_data.dataset_schema(manifest)["sparse"], run_dir
    )
    if differs:
        return differs, ""
    differs = _feature_difference(manifest, saved)
    if differs:
        return f"not the schema {run_dir} trained on: its {differs}", ""
    if "preprocessing" in record:  # a run from before preprocessing records has none to compare
        differs = trained_data.preprocessing_differences(
            record["preprocessing"],
            trained_data.preprocessing(manifest),
            (trained_data.recorded_spec(record), manifest.options.get("spec")),
        )
        if differs:
            return (
                f"preprocessed with other settings than the data {run_dir} trained on ({differs})",
                "; preprocess it with the training data's settings",
            )
    return "", ""


def _feature_difference(manifest: Manifest, saved: dict[str, Any]) -> str:
    """The first of the run's dense or sparse features that the data's differ from ("" if none)."""
    mine = trained_data.dataset_schema(manifest)
    for key, what in (
        ("dense", "dense features"),
        ("sparse", "sparse features (name, cardinality, multi-hot)"),
    ):
        same = trained_data.same_feature if key == "sparse" else (lambda a, b: a == b)
        theirs = [tuple(x) if isinstance(x, list) else x for x in saved[key]]
        ours = [tuple(x) if isinstance(x, list) else x for x in mine[key]]
        first = next(
            (i for i, (a, b) in enumerate(zip(theirs, ours)) if not same(a, b)),
            None if len(theirs) == len(ours) else min(len(theirs), len(ours)),
        )
        if first is not None:
            return (
                f"{what} differ at #{first} ({_at(ours, first)} here, {_at(theirs, first)} in "
                "training)"
            )
    return ""


def _at(items: list[Any], i: int) -> str:
    return str(items[i]) if i < len(items) else "none"


def trained_world_size(run_dir: Path) -> int:
    """The world size the run trained on (its plan's); ValueError when the run has no plan file."""
    path = Path(run_dir) / names.PLAN
    if not path.is_file():
        raise ValueError(names.no_run_file(run_dir, names.PLAN))
    return load_plan(path).fingerprint.world_size


def find_checkpoint(run_dir: Path, step: int | None) -> tuple[int, Path]:
    """(step, path) of the run's checkpoint at `step` (None: the newest); ValueError names what
    exists."""
    directory = Path(run_dir) / names.CHECKPOINTS
    if not Path(run_dir).exists():
        raise ValueError(names.no_run_file(run_dir, names.CHECKPOINTS))
    done = complete_checkpoints(directory)
    torn = torn_checkpoint(directory) if step is None else None
    if torn is not None:  # the user's newest step: not the one before it without a word
        instead = (
            f"evaluate or export the one before it, {done[-1][1]}, with --checkpoint {done[-1][0]}"
            if done
            else "there is no complete checkpoint before it"
        )
        raise ValueError(
            torn_checkpoint_message(torn, f"{instead}; or move {torn} out of {directory}")
        )
    # A renamed folder (step-8) may hold the user's newest step, or the one asked for: named, as
    # train names it, rather than another checkpoint read without a word.
    misnamed = misnamed_checkpoints(directory)
    unread = f"; {misnamed_checkpoint_message(misnamed[0])}" if misnamed else ""
    passed_over = misnamed_passed_over(directory) if step is None else []
    if passed_over:
        instead = (
            f"; or evaluate or export the newest named one, {done[-1][1]}, with --checkpoint "
            f"{done[-1][0]}"
            if done
            else ""
        )
        raise ValueError(misnamed_checkpoint_message(passed_over[0]) + instead)
    other_step = _other_step_refusal(directory, done, step)
    if other_step:
        raise ValueError(other_step)
    if not done:
        raise ValueError(f"{run_dir}: no complete checkpoint in {directory}{unread}")
    if step is None:
        return done[-1]
    for found in done:
        if found[0] == step:
            return found
    raise ValueError(
        f"{run_dir}: no complete checkpoint of step {step} (has steps "
        f"{', '.join(str(s) for s, _ in done)}){unread}"
    )


def _other_step_refusal(directory: Path, done: list[tuple[int, Path]], step: int | None) -> str:
    """The one line refusing the checkpoint folder that reading `step` (None: the newest) reads,
    or passes over, where it holds another step than its name says (copied or moved by hand;
    other_step_read): read, it would be evaluated or exported as the step its name says. ""
    where there is none."""
    read = other_step_read(directory, step)
    if read is None:
        return ""
    other = dict(other_step_checkpoints(directory))
    own = [found for found in done if found[1] not in other]
    instead = f"; or evaluate or export {own[-1][1]} with --checkpoint {own[-1][0]}" if own else ""
    return other_step_message(*read) + instead


def check_request(
    request: EvalRequest, world_size: int, defaulted: bool = False
) -> tuple[JobConfig, Manifest]:
    """Everything that can be checked before ranks start: ValueError with one clear line.

    defaulted: world_size is the run's own (the user gave no --nproc-per-node), so a refusal
    names where it came from rather than a flag the user did not type."""
    config = run_config(request.run_dir)
    find_checkpoint(request.run_dir, request.step)
    manifest = run_dataset(request.run_dir, config, request.data)
    if request.data is not None:  # every loader below reads the other data
        config = dataclasses.replace(
            config, data=dataclasses.replace(config.data, path=str(request.data))
        )
    if request.split not in manifest.splits or manifest.splits[request.split].rows == 0:
        has = ", ".join(s for s, info in manifest.splits.items() if info.rows)
        raise ValueError(
            f"{config.data.path}: no rows in split {request.split!r} to evaluate (has {has})"
        )
    batch = config.eval.batch_size or config.train.global_batch_size
    if batch % world_size:
        # eval takes no --set: the rank count is the user's one way out, so name the ones that work.
        fits = [n for n in range(1, max(8, 2 * world_size) + 1) if batch % n == 0]
        ranks = ", ".join(map(str, fits[:-1])) + (" or " if len(fits) > 1 else "") + str(fits[-1])
        raise ValueError(
            f"the run's evaluation batch {batch} does not divide by {world_size} ranks "
            f"(eval.batch_size, else train.global_batch_size): use --nproc-per-node {ranks}"
        )
    # The ranks evaluate on the request's device, not the run's train.device: a checkpoint
    # written on CUDA loads onto CPU ranks and the other way round, at any rank count.
    kind = eval_device_kind(request.device)
    asked = (
        f"the run's world size, {world_size} ranks (eval's default --nproc-per-node)"
        if defaulted
        else None
    )
    gpus_remedy = (
        " (--nproc-per-node: the checkpoint is resharded to any rank count), "
        "or evaluate on CPU ranks with --device cpu"
    )
    check_ranks_fit(kind, world_size, asked, gpus_remedy)
    data_options.model_manifest(manifest, config.data)
    return config, manifest


def check_checkpoint_files(request: EvalRequest) -> None:
    """ValueError, in the line the ranks would give, for the request's checkpoint where a file
    fails its digests, another user could have written it, or it cannot be read (saved cut
    short): the CLI's check, before torchrun and torchrec start (the ranks check every file again
    before reading any). Hashes all but the bulky `.distcp` shards, as `shardrec train` does."""
    _, path = find_checkpoint(request.run_dir, request.step)
    try:
        verify_checkpoint(path, skip_suffix=".distcp")
    except UntrustedCheckpoint as e:
        raise refused_with_advice(str(e), path, READ_ANOTHER) from None
    unreadable = unreadable_problem(path, READ_ANOTHER)
    if unreadable:
        raise ValueError(unreadable)


EVAL_ON_CPU = "or evaluate on the CPU with --device cpu"


def eval_device_kind(device: str) -> str:
    """ "cpu" or "cuda" for eval's --device (auto: this host's); ValueError (one line) for cuda
    where torch cannot use CUDA here."""
    kind = resolve_device_kind(device, setting="--device auto", instead=EVAL_ON_CPU)
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            reason = cuda_unusable_reason(EVAL_ON_CPU) or (
                f"torch {torch.__version__} sees no CUDA device here; evaluate on the CPU "
                "with --device cpu"
            )
            raise ValueError(f"--device cuda: {reason}")
    return kind
