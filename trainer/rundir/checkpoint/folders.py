"""Which checkpoint folders a command reads, and those it must not pass over without a word:
folders renamed, copied or moved by hand (not named step-NNNNNNNN, or named for another step than
they hold) and torn ones (no digests.json), each said in one line. Torch-free: `shardrec runs`,
`train`, `eval` and `export` check them before any rank starts, a plain torchrun's ranks first."""

from __future__ import annotations

import os
from pathlib import Path

from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.held_step import held_step
from shardrec.trainer.rundir.checkpoint.trust import complete_checkpoints


def misnamed_checkpoints(directory: Path) -> list[Path]:
    """The folders in `directory` (RUN/checkpoints) that hold a checkpoint's files (digests.json
    or train_state.pt) under a name no command reads (not step-NNNNNNNN: renamed or copied by
    hand), sorted; a save's hidden temporary folders are not among them, nor a link to one of
    the checkpoints beside it (`latest` -> step-00000008: that checkpoint, read by its name).
    Torch-free."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(
        path
        for path in directory.iterdir()
        if not path.name.startswith(".")
        and not names.CHECKPOINT_RE.match(path.name)
        and ((path / names.DIGESTS).is_file() or (path / names.TRAIN_STATE).is_file())
        and not _links_to_a_checkpoint(path)
    )


def misnamed_passed_over(directory: Path) -> list[Path]:
    """The misnamed_checkpoints that reading the newest complete checkpoint would pass over without
    a word: holding a step past its (`step-8`, the user's newest, renamed), or any where there is
    none, or whose step cannot be read. A copy of an older or the same step (`step-00000008.bak`)
    is read by nothing and stops nothing."""
    done = complete_checkpoints(directory)
    newest = done[-1][0] if done else -1
    return [
        path
        for path in misnamed_checkpoints(directory)
        if (held := held_step(path)) is None or held > newest
    ]


def _links_to_a_checkpoint(path: Path) -> bool:
    """Whether `path` is a symbolic link to a step-NNNNNNNN folder of its own directory."""
    if not path.is_symlink():
        return False
    target = Path(os.path.realpath(path))  # never raises, a loop of links included
    beside = Path(os.path.realpath(path.parent))
    return target.parent == beside and bool(names.CHECKPOINT_RE.match(target.name))


def misnamed_checkpoint_message(path: Path) -> str:
    """The one line saying that no command reads the checkpoint folder `path`, and what to do:
    the name of the step its train_state.pt holds, or, where that cannot be read, of its digits."""
    digits = "".join(c for c in path.name if c.isdigit())
    todo = "rename it step-NNNNNNNN, the 8-digit step it holds, or move it out"
    held = held_step(path)
    if held is not None and (path.parent / names.checkpoint_name(held)).exists():
        todo = (
            f"it holds step {held:,}, as {names.checkpoint_name(held)} does (a copy): move it out"
        )
    elif held is not None:
        todo = f"it holds step {held:,}: rename it {names.checkpoint_name(held)}, or move it out"
    elif digits and len(digits) <= 8:
        step = int(digits)
        todo = f"rename it {names.checkpoint_name(step)} if it holds step {step:,}, or move it out"
    return (
        f"{path}: a checkpoint's files in a folder not named step-NNNNNNNN, which no command "
        f"reads (renamed or copied by hand?); {todo} of {path.parent}"
    )


def copied_checkpoints(directory: Path) -> list[tuple[Path, Path]]:
    """(copy, the checkpoint it is a copy of) for each complete checkpoint in `directory` whose
    digests.json is byte for byte another's: the same files under two step names (a folder copied
    by hand). Two saves never agree: train_state.pt holds the step, and the copy is the folder not
    named for it (a copy may take an older step's name); where that cannot be read, the newer
    name. Torch-free."""
    same: dict[bytes, list[tuple[int, Path]]] = {}
    for step, path in complete_checkpoints(directory):
        try:
            same.setdefault((path / names.DIGESTS).read_bytes(), []).append((step, path))
        except OSError:
            continue
    pairs = []
    for found in (group for group in same.values() if len(group) > 1):
        held = held_step(found[0][1])
        original = next((path for step, path in found if step == held), found[0][1])
        pairs += [(path, original) for _, path in found if path != original]
    return sorted(pairs)


def copied_checkpoint_message(path: Path, original: Path) -> str:
    """The one line saying that `path` holds the same files as `original`, and what to do."""
    return (
        f"{path}: the same files as {original.name} (their {names.DIGESTS} agree: a copy), one "
        "step's checkpoint under two names; train, eval and export refuse the one not named for "
        f"its step: move the copy out of {path.parent}"
    )


def other_step_checkpoints(directory: Path) -> list[tuple[Path, int]]:
    """(folder, the step it holds) for each complete checkpoint in `directory` (RUN/checkpoints)
    whose train_state.pt holds another step than its name says: copied or moved by hand under
    another step's name. Oldest name first; one whose step cannot be read is not among them (its
    load refuses it). Torch-free."""
    return [
        (path, held)
        for step, path in complete_checkpoints(directory)
        if (held := held_step(path)) is not None and held != step
    ]


def other_step_read(directory: Path, step: int | None = None) -> tuple[Path, int] | None:
    """(folder, step it holds) of a folder of other_step_checkpoints that reading `step` reads:
    its folder; for the newest (None), the newest folder, or one holding a step past the newest
    name's (reading that name would pass over it). None where there is none: an older misnamed
    folder beside a sound newest one is read by nothing that reads the newest."""
    other = other_step_checkpoints(directory)
    done = complete_checkpoints(directory)
    if step is not None:
        read = [(path, held) for path, held in other if path.name == names.checkpoint_name(step)]
    else:
        read = [(path, held) for path, held in other if path == done[-1][1] or held > done[-1][0]]
    return read[-1] if read else None


def other_step_message(path: Path, held: int) -> str:
    """The one line saying that the checkpoint folder `path` holds step `held`, not the step its
    name says, and what to do: move it out where the folder of its step is there too (a copy),
    else rename it for its step."""
    match = names.CHECKPOINT_RE.match(path.name)
    assert match is not None, path  # other_step_checkpoints finds step-NNNNNNNN folders only
    named = int(match.group(1))
    own = names.checkpoint_name(held)
    if (path.parent / own).exists():
        todo = f"copied by hand? {own} is there too); move {path.name} out of {path.parent}"
    else:
        todo = f"renamed by hand?); rename it {own}, or move it out of {path.parent}"
    return (
        f"{path / names.TRAIN_STATE}: holds the checkpoint of step {held:,}, not of step "
        f"{named:,} as its folder's name says ({todo}"
    )


def torn_checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint folder in `directory` that has no digests.json and is newer than the
    newest complete one (None: there is none). A save renames its folder into place only after
    writing them, so a copy or a clean-up left it; taking the one before it without a word would
    use (and a re-save replace) another step than the user's newest."""
    directory = Path(directory)
    done = complete_checkpoints(directory)
    after = done[-1][0] if done else -1
    torn = sorted(
        (int(m.group(1)), path)
        for path in (directory.iterdir() if directory.is_dir() else [])
        if (m := names.CHECKPOINT_RE.match(path.name)) and int(m.group(1)) > after
    )
    return torn[-1][1] if torn else None


def torn_checkpoint_message(path: Path, instead: str) -> str:
    """The one line refusing `path`, a folder torn_checkpoint found; `instead`: what to do."""
    return (
        f"{path}: no {names.DIGESTS}: not a complete checkpoint (a save writes it last and "
        f"renames the folder into place after it: a copy or a clean-up left this one); {instead}"
    )


def misnamed_refusal(run_dir: Path, also: str = "") -> str | None:
    """The one line refusing RUN's first checkpoint folder no command reads that a resume would
    pass over without a word (misnamed_passed_over), else one named for another step than it holds
    that a resume would read or pass over (other_step_read: the ranks would refuse it, or resume
    before the step it holds), ending in `also`; None where there is none."""
    directory = Path(run_dir) / names.CHECKPOINTS
    found = misnamed_passed_over(directory)
    if found:
        return f"{misnamed_checkpoint_message(found[0])}{also}"
    other = other_step_read(directory)
    return f"{other_step_message(*other)}{also}" if other else None


def torn_refusal(run_dir: Path, also: str = "") -> str | None:
    """The one line refusing RUN's torn checkpoint folder (torn_checkpoint: resuming from an older
    one without a word, and replacing it at its step, would drop it), ending in `also`; None
    where there is none."""
    directory = Path(run_dir) / names.CHECKPOINTS
    torn = torn_checkpoint(directory)
    if torn is None:
        return None
    done = complete_checkpoints(directory)
    instead = (
        f"to resume from {done[-1][1]} (step {done[-1][0]})" if done else "to start from step 0"
    )
    return torn_checkpoint_message(torn, f"{instead}, move {torn} out of {directory}{also}")


def check_checkpoint_folders(run_dir: Path) -> None:
    """ValueError (misnamed_refusal's or torn_refusal's line) where a resume would pass over a
    checkpoint folder, or read one named for another step than it holds, without a word. For
    ranks a plain torchrun starts; `shardrec train` refuses the same, adding its --restart, before
    it starts its ranks."""
    line = misnamed_refusal(run_dir) or torn_refusal(run_dir)
    if line is not None:
        raise ValueError(line)
