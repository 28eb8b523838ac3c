"""The Criteo path writes the same bytes it always has: synthetic logs, the dataset's files, its
manifest (less the versions of the software that wrote it) and the batch stream, pinned by digest.

The digests were taken from the code before feature specs existed; a change that moves any byte
of a default (Criteo-shaped) dataset fails here. "files" was taken over the `.npy` files of the
layout before one file per part; since, it is taken over each column as that layout held it
(dataset_writing.old_layout_files): the same digests, so the same rows, ids and dense values, and the same
stream. "parts" (the part files) and "manifest" were taken once when parts became one Arrow IPC
file each; they depend on shardrec's code only, not on the pyarrow installed (the files are
written byte for byte by dataloader/format/arrow_ipc.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from dataset_writing import old_layout_files
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

runner = CliRunner()

# (synth flags, preprocess flags) -> digests of (the synthetic text, the dataset's files, the
# manifest without "versions", the first batches of `data digest`).
CASES = {
    "tsv-hash": (
        ["--rows", "3000", "--seed", "5", "--max-vocab", "400"],
        ["--max-ids", "1000", "--chunk-mb", "0.05"],
    ),
    "csv-vocab-float16": (
        ["--rows", "2500", "--seed", "6", "--max-vocab", "300", "--csv"],
        ["--csv", "--min-count", "2", "--float16", "--dense-transform", "signed-log1p"],
    ),
    "days-per-feature-ids": (
        ["--rows", "2400", "--seed", "8", "--max-vocab", "200", "--days", "3"],
        [
            "--max-ids",
            ",".join(str(50 + 10 * i) for i in range(26)),
            "--dense-transform",
            "shift-log1p",
        ],
    ),
}
PINNED = {
    "tsv-hash": {
        "text": "5845afb711756bca730c0733e74d59802de640e13088621ea5cd5702a4be54ff",
        "files": "a337c4a5267768ed6b3d424829a58e0412a96654261821ca906cc46a4ffa9e7d",
        "manifest": "0931b31b22f8c04caa332da15e18fb767ddaa25d665d94c092d16349f1bbf7b2",
        "parts": "a0566f1b37f1609ed2bb8deb8b3db03bcce87579a40e70ae914b5895c3065fff",
        "stream": "3635e8b8707470454ac4fb53532c7d9673922f4c9f2ea73b6b160737776be9f2",
    },
    "csv-vocab-float16": {
        "text": "5f543ab329d355c665d1f4290fce44b5c77e42f38effe402b39a8df949cd42ee",
        "files": "8edc3c10cc07215d57ddf46ec1ac6bd76937a9efb9d3978c2dcddb47cda4f3ec",
        "manifest": "ec2ca7d10e36671bf6873fbe944d918beb4a5545d9df66785e09ff61da06f797",
        "parts": "623f67cd2c5f997f6427227461a7d20539b16886ed5fae5fcad420ec9be1d67e",
        "stream": "7b4d49fcbef473d0109a5f40d4ba535137413008e692b650ebe24df5141e80bd",
    },
    "days-per-feature-ids": {
        "text": "22e68a3cbb4e243d8139039ea5533457e567d8a890d0fa45b58aea0c9cbf46b2",
        "files": "8b82c4323fe10ddaf3748df72c0b1ab372325df7ab9b27cf22283046b33a69a5",
        "manifest": "e58137e89b726fde629b69b836cfa3ef77f18f47e9ee64137257165dd9869467",
        "parts": "a4b2bad182accbc4c4fef20d8250cf4e0446608ea3cc63e6620cb3f1e595e725",
        "stream": "a35e167631653c8f5cc31da32078bcb789fde2037de3c09cf3596d1156fd5858",
    },
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cli(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


def digests(tmp: Path, synth_flags: list[str], preprocess_flags: list[str]) -> dict[str, str]:
    raw, out = tmp / "raw", tmp / "data"
    _cli("synth", raw, *synth_flags)
    text = b"".join(p.read_bytes() for p in sorted(raw.iterdir()) if not p.name.startswith("."))
    _cli("preprocess", raw, "--out", out, *preprocess_flags)
    manifest = json.loads((out / "manifest.json").read_text())
    columns = old_layout_files(out)
    parts = sorted(
        p.relative_to(out).as_posix() for p in out.rglob("*.arrow") if ".work" not in p.parts
    )
    stream = json.loads(
        _cli("data", "digest", out, "--global-batch", "256", "--batches", "3", "--json")
    )
    del manifest["versions"]
    return {
        "text": _sha(text),
        "files": _sha("".join(f"{f}:{_sha(columns[f])}\n" for f in sorted(columns)).encode()),
        "parts": _sha("".join(f"{f}:{_sha((out / f).read_bytes())}\n" for f in parts).encode()),
        "manifest": _sha(json.dumps(manifest, sort_keys=True).encode()),
        "stream": _sha(json.dumps(stream["digests"]).encode()),
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_spec_writes_the_bytes_it_always_wrote(case: str, tmp_path: Path) -> None:
    assert digests(tmp_path, *CASES[case]) == PINNED[case]
