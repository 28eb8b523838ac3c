"""`shardrec train`'s checks of its run directory before a launch: its lock, where it lies beside
the dataset, the checkpoint a rerun resumes from."""

from __future__ import annotations

from pathlib import Path

from shardrec.tools.cli.common import fail
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.lock import RunLock


def kept_checkpoint(out_dir: Path) -> str:
    """What a rerun resumes from ("" when nothing)."""
    from shardrec.trainer.rundir.checkpoint.trust import complete_checkpoints

    done = complete_checkpoints(out_dir / names.CHECKPOINTS)
    if not done:
        return ""
    step, path = done[-1]
    return f"the newest complete checkpoint, {path} (step {step}), is kept and a re-run resumes from it"


def refused_checkpoint(out_dir: Path) -> str:
    """What to do when the newest checkpoint failed its digests: a rerun would resume from it
    and fail again; the one before it is a choice for the user (shardrec never drops a
    checkpoint on its own)."""
    from shardrec.trainer.rundir.checkpoint.trust import complete_checkpoints

    done = complete_checkpoints(out_dir / names.CHECKPOINTS)
    if len(done) < 2:
        return "no earlier checkpoint: start over with --restart"
    (step, path), newest = done[-2], done[-1][1]
    return (
        f"a re-run resumes from that checkpoint again; to resume from the one before it, {path} "
        f"(step {step}), move {newest} out of {newest.parent}, or start over with --restart"
    )


def lock_run_dir(out_dir: Path, job_id: str, create: bool) -> RunLock | None:
    """Hold OUT_DIR's lock for this job (None: no OUT_DIR yet and `create` off); one line naming
    the holder when another job has it. The ranks' rank 0 accepts this lock as its own."""
    from shardrec.trainer.rundir.lock import RunDirInUse, acquire_run_lock

    if not create and not out_dir.is_dir():
        return None
    file = next((p for p in (out_dir, *out_dir.parents) if p.exists() and not p.is_dir()), None)
    if file is not None:  # the lock's own error said only "File exists" or "Not a directory"
        fail(
            f"--out-dir {out_dir}: {file} is a file, not a folder; give a folder for the run "
            "(a new one, or a run's to resume it)"
        )
    try:
        return acquire_run_lock(out_dir, job_id)
    except RunDirInUse as e:
        fail(str(e))
    except OSError as e:
        fail(f"{out_dir}: cannot lock the run directory: {e.strerror}")


def check_resume_checkpoint(out_dir: Path) -> None:
    """Refuse, in one line, a checkpoint to resume from that fails its digests, that another
    user could have written, that cannot be read (a file saved cut short) or that another run
    saved (copied in); the ranks check its shards too before loading anything."""
    from shardrec.trainer.rundir.checkpoint.folders import torn_refusal
    from shardrec.trainer.rundir.checkpoint.held_step import held_run_id
    from shardrec.trainer.rundir.checkpoint.readable import unreadable_problem
    from shardrec.trainer.rundir.checkpoint.signature import other_run_refusal, read_run_id
    from shardrec.trainer.rundir.checkpoint.trust import (
        REFUSED,
        UntrustedCheckpoint,
        complete_checkpoints,
        verify_checkpoint,
    )

    torn = torn_refusal(out_dir, ", or start over with --restart")
    if torn is not None:
        fail(torn)
    done = complete_checkpoints(out_dir / names.CHECKPOINTS)
    if done:
        try:
            verify_checkpoint(done[-1][1], skip_suffix=".distcp")
        except UntrustedCheckpoint as e:
            fail(f"{e}; {refused_checkpoint(out_dir)}")
        unreadable = unreadable_problem(done[-1][1], REFUSED)
        if unreadable:
            fail(f"{unreadable}; {refused_checkpoint(out_dir)}")
        # Before, the ranks refused it once torchrun and torchrec had started (check_signature).
        other = other_run_refusal(done[-1][1], held_run_id(done[-1][1]), read_run_id(out_dir))
        if other:
            fail(f"{other}; {refused_checkpoint(out_dir)}")


def check_no_misnamed_checkpoint(out_dir: Path) -> None:
    """Refuse a checkpoint folder no command reads (not named step-NNNNNNNN: renamed or copied by
    hand) that holds a step past the newest checkpoint's (folders.misnamed_passed_over): the job
    would resume from an older checkpoint, or start over, beside it without a word.
    Checked before what the run directory's checkpoints say (a --continue-on would otherwise be
    told there is no checkpoint to go on from, or that the stretch is unfinished)."""
    from shardrec.trainer.rundir.checkpoint.folders import misnamed_refusal

    line = misnamed_refusal(out_dir, "; or start over with --restart")
    if line is not None:
        fail(line)


def check_apart(out_dir: Path, data: Path) -> None:
    """ValueError for a run directory that is the dataset's, inside it or around it, or another
    dataset: the run's files would land among the parts, and --restart moves the run directory
    (and so the dataset) aside."""
    from shardrec.dataloader.format.manifest import MANIFEST

    run, dataset = out_dir.resolve(), data.resolve()
    if run == dataset or dataset in run.parents or run in dataset.parents:
        where = "is" if run == dataset else "is inside" if dataset in run.parents else "holds"
        raise ValueError(
            f"--out-dir {out_dir} {where} the dataset directory {data}; give the run a directory "
            "of its own"
        )
    if (out_dir / MANIFEST).is_file():  # another dataset: its parts would hold the run's files
        raise ValueError(
            f"--out-dir {out_dir} is a dataset directory (it holds {MANIFEST}); give the run a "
            "directory of its own"
        )
