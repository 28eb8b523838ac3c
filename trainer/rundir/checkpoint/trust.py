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
