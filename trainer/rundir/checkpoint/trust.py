"""Why a checkpoint may be loaded: a digest of each of its files, and who could have changed them.

Threat model. A run directory may sit on a shared filesystem where other users can write. Most
of a checkpoint loads without running code (tensors and JSON, `torch.load(weights_only=True)`),
but torch's DCP reads its `.metadata` with `pickle.load`, and anyone who can replace a pickle
can run code on every rank that loads it. So:

- at save time, once every rank has written, rank 0 hashes each file of the checkpoint
  (sha256) into `digests.json`, written last: a checkpoint without it is not complete;
- before anything of a checkpoint is read, every file is checked against it (the ranks share
  the hashing), and a file missing, changed or not listed refuses the checkpoint, naming it;
- `digests.json` itself, and the checkpoint directory holding it, must belong to the user
  running the job and be writable by nobody else (the save makes them so whatever the umask):
  another user who could rewrite the digests, or swap in a directory of their own, is refused.

Trusted: the user running the job (and root), the machines of the job and its rendezvous
network. Not defended: a change between the check and the read (the files are read twice,
seconds apart), or an attacker with this user's rights.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.dataset_files import file_sha256
from shardrec.dataloader.util.files import atomic_open
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.held_step import held_step

DIGESTS_VERSION = 1
REFUSED = "refusing the checkpoint"
"""How every refusal of a checkpoint's files ends: `shardrec train` tells a failed run by it."""


def complete_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in `directory` (RUN/checkpoints), oldest first:
    the ones with their digests, written last. Torch-free, for `shardrec runs`."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = names.CHECKPOINT_RE.match(path.name)
        if match and (path / names.DIGESTS).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


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


class UntrustedCheckpoint(ValueError):
    """A checkpoint whose files do not match its digests, or that someone else could have
    changed."""


def _files(directory: Path) -> list[str]:
    """Every file under `directory` but the digests, as sorted relative POSIX paths."""
    found = []
    for root, _, files in os.walk(directory):
        for name in files:
            rel = (Path(root) / name).relative_to(directory).as_posix()
            if rel != names.DIGESTS:
                found.append(rel)
    return sorted(found)


def _private(mode: int) -> int:
    return mode & ~(stat.S_IWGRP | stat.S_IWOTH)


def write_digests(directory: Path) -> None:
    """Hash every file of the checkpoint in `directory` into its digests.json (rank 0, after every
    rank wrote; the last file of a save), and make the directory and digests writable by this user
    only."""
    directory = Path(directory)
    digests = {rel: file_sha256(directory / rel) for rel in _files(directory)}
    record = {"version": DIGESTS_VERSION, "algorithm": "sha256", "files": digests}
    with atomic_open(directory / names.DIGESTS) as f:
        f.write((json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    for path in (directory / names.DIGESTS, directory):
        os.chmod(path, _private(path.stat().st_mode))


def check_owner(path: Path) -> None:
    """Refuse `path` unless it belongs to this user and nobody else may write it."""
    if not hasattr(os, "getuid"):
        return  # no POSIX ownership to check
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise UntrustedCheckpoint(
            f"{path}: owned by uid {st.st_uid}, not by this user (uid {os.getuid()}); "
            f"refusing a checkpoint someone else wrote"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCheckpoint(
            f"{path}: writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"refusing it (chmod go-w {path} if you trust it)"
        )


def read_digests(directory: Path) -> dict[str, str]:
    """The digests of the checkpoint in `directory`, after checking who could have written them."""
    directory = Path(directory)
    path = directory / names.DIGESTS
    check_owner(directory)
    check_owner(path)
    try:
        record: Any = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UntrustedCheckpoint(f"{path}: unreadable digests ({e})") from None
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise UntrustedCheckpoint(f"{path}: not a digests file (no files -> sha256 table)")
    return files


def verify_files(
    directory: Path,
    digests: dict[str, str],
    rank: int = 0,
    world_size: int = 1,
    skip_suffix: str = "",
) -> str:
    """Check this rank's share of the files (every `world_size`-th), but those ending in
    `skip_suffix` when one is given; "" or the first problem found."""
    directory = Path(directory)
    wanted = sorted(rel for rel in digests if not (skip_suffix and rel.endswith(skip_suffix)))
    if rank == 0:
        extra = sorted(set(_files(directory)) - set(digests))
        if extra:
            added = directory / extra[0]
            return f"{added}: not listed in {names.DIGESTS} (added after the save); {REFUSED}"
        # Files left unhashed (`skip_suffix`) must be there too: a stat each, cheap.
        gone = next((rel for rel in sorted(digests) if not (directory / rel).is_file()), None)
        if gone is not None:
            return f"{directory / gone}: listed in {names.DIGESTS} but missing; {REFUSED}"
    for rel in wanted[rank::world_size]:
        path = directory / rel
        if not path.is_file():
            return f"{path}: listed in {names.DIGESTS} but missing; {REFUSED}"
        if file_sha256(path) != digests[rel]:
            return (
                f"{path}: contents differ from the digest written at save time (changed since); "
                f"{REFUSED}"
            )
    return ""


def verify_checkpoint(directory: Path, skip_suffix: str = "") -> None:
    """Check a checkpoint on this process, all of it but the files ending in `skip_suffix`
    (`shardrec train` checks all but the bulky `.distcp` shards before it starts ranks, which then
    check everything); UntrustedCheckpoint naming the first bad file."""
    problem = verify_files(directory, read_digests(directory), skip_suffix=skip_suffix)
    if problem:
        raise UntrustedCheckpoint(problem)


def checkpoint_problem(directory: Path) -> str:
    """Why the checkpoint in `directory` would be refused ("" when it would not), checked as
    `shardrec train` checks it before starting ranks: every file there, all but the bulky `.distcp`
    shards hashed. Torch-free, for `shardrec runs`."""
    try:
        verify_checkpoint(directory, skip_suffix=".distcp")
    except UntrustedCheckpoint as e:
        return str(e)
    return ""


class UnreadableCheckpoint(ValueError):
    """A checkpoint whose files match their digests but cannot be read: written truncated or
    corrupt (the digests vouch only for what was there at save time)."""


def other_checkpoints(directory: Path) -> str:
    """What else a reader of the checkpoint in `directory` may read: the run's other complete
    checkpoints' steps."""
    others = [step for step, path in complete_checkpoints(directory.parent) if path != directory]
    if not others:
        return "this run has no other checkpoint"
    return f"this run's other checkpoints: steps {', '.join(str(s) for s in others)}"


def refused_with_advice(problem: str, directory: Path, advice: str) -> UntrustedCheckpoint:
    """The refusal `problem` of the checkpoint in `directory`, ending in what to do (`advice`) and
    the run's other checkpoints; a resume's (advice REFUSED) as it is: `shardrec train` adds the
    way past it."""
    if advice == REFUSED:
        return UntrustedCheckpoint(problem)
    return UntrustedCheckpoint(f"{problem}; {advice} ({other_checkpoints(directory)})")


def unreadable_checkpoint(
    directory: Path, error: BaseException, advice: str, file: str = ""
) -> BaseException:
    """What a failed read of the checkpoint in `directory` raises instead of what torch raised
    (`error`: DCP's CheckpointException, which wraps each rank's failure, a Ctrl-C's too, or
    torch.load's error reading its `file`): a Ctrl-C stays a KeyboardInterrupt; anything else is
    one line naming the folder (and the file, where known), the first failure and what to do
    (`advice`), with the run's other complete checkpoints."""
    failures = getattr(error, "failures", None) or {}
    causes = [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    if any(isinstance(c, KeyboardInterrupt) for c in causes):
        return KeyboardInterrupt()
    cause = causes[0] if causes else error
    # torch's messages run on ("This is an internal miniz error. If you are seeing ..."): the
    # first sentence says what failed.
    said = str(cause).strip().split(". ")[0].splitlines()[0] if str(cause).strip() else ""
    # An exception without a message (EOFError of a file cut to nothing) is named by its type.
    failure = f"{type(cause).__name__}: {said}" if said else type(cause).__name__
    return unreadable_file(directory, f"{file}: {failure}" if file else failure, advice)


def unreadable_file(directory: Path, failure: str, advice: str) -> UnreadableCheckpoint:
    """The one line refusing the checkpoint in `directory`, a file of which matches its digests
    but cannot be read (`failure`: which and why), ending in what to do (`advice`) and the run's
    other complete checkpoints."""
    return UnreadableCheckpoint(
        f"{directory}: a file of this checkpoint is truncated or unreadable ({failure}), though it "
        f"matches its digests (it was saved that way); {advice} ({other_checkpoints(directory)})"
    )
