"""The Criteo path writes the same bytes it always has: synthetic logs, the dataset's files, its
manifest (less the versions of the software that wrote it) and the batch stream, pinned by digest.

The digests were taken from the code before feature specs existed; a change that moves any byte
of a default (Criteo-shaped) dataset fails here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
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
        "manifest": "87c68d369e898ffe6091cda71a30e92024ea48cfeac79524b030d2ef7e941875",
        "stream": "3635e8b8707470454ac4fb53532c7d9673922f4c9f2ea73b6b160737776be9f2",
    },
    "csv-vocab-float16": {
        "text": "5f543ab329d355c665d1f4290fce44b5c77e42f38effe402b39a8df949cd42ee",
        "files": "8edc3c10cc07215d57ddf46ec1ac6bd76937a9efb9d3978c2dcddb47cda4f3ec",
        "manifest": "be3fd60e6b6926978e43c42eab19bfc99d8154d19cfdb7c3c4972fcf05d1268e",
        "stream": "7b4d49fcbef473d0109a5f40d4ba535137413008e692b650ebe24df5141e80bd",
    },
    "days-per-feature-ids": {
        "text": "22e68a3cbb4e243d8139039ea5533457e567d8a890d0fa45b58aea0c9cbf46b2",
        "files": "8b82c4323fe10ddaf3748df72c0b1ab372325df7ab9b27cf22283046b33a69a5",
        "manifest": "fcccd0c5179cf4f364c512763bb1d924c556e356ce10ee04f20a5505c63d5543",
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
    text = b"".join(p.read_bytes() for p in sorted(raw.iterdir()))
    _cli("preprocess", raw, "--out", out, *preprocess_flags)
    manifest = json.loads((out / "manifest.json").read_text())
    files = sorted(
        p.relative_to(out).as_posix() for p in out.rglob("*.npy") if ".work" not in p.parts
    )
    stream = json.loads(
        _cli("data", "digest", out, "--global-batch", "256", "--batches", "3", "--json")
    )
    del manifest["versions"]
    return {
        "text": _sha(text),
        "files": _sha("".join(f"{f}:{_sha((out / f).read_bytes())}\n" for f in files).encode()),
        "manifest": _sha(json.dumps(manifest, sort_keys=True).encode()),
        "stream": _sha(json.dumps(stream["digests"]).encode()),
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_spec_writes_the_bytes_it_always_wrote(case: str, tmp_path: Path) -> None:
    assert digests(tmp_path, *CASES[case]) == PINNED[case]
