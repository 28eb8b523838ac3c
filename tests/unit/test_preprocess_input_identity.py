"""An input as a rerun knows it (text/file_identity.py): a sampled digest that sees a file replaced
by another of the same size, and a run record of an older shardrec (no digests) that still
resumes on the same inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardrec.dataloader.util.locks import WORK_DIR
from shardrec.tools.preprocess.settings import RUN_RECORD, PreprocessConfig, check_fingerprint
from shardrec.tools.preprocess.text.file_identity import SAMPLE_KEY, SAMPLED_BYTES, sampled_sha256


@pytest.mark.parametrize(
    ("at", "length"),
    [(0, 1), (4 << 20, 256 << 10), ((8 << 20) - 1, 1)],
    ids=["head", "middle", "tail"],
)
def test_the_digest_of_a_large_file_sees_another_file_of_its_size(
    tmp_path: Path, at: int, length: int
):
    data = bytearray(range(256)) * (8 << 12)  # 8 MiB: sampled, not read whole
    assert len(data) > SAMPLED_BYTES
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(data)
    b.write_bytes(data)
    assert sampled_sha256(a) == sampled_sha256(b)
    # 256 KiB in the middle: longer than a gap between the samples
    data[at : at + length] = bytes(x ^ 1 for x in data[at : at + length])
    b.write_bytes(data)
    assert sampled_sha256(a) != sampled_sha256(b)


def test_an_older_record_without_digests_resumes_and_gets_them(tmp_path: Path):
    log = tmp_path / "train.txt"
    log.write_text("1\t2\n")
    cfg = PreprocessConfig([log], tmp_path / "out", max_ids=[100])
    fp = cfg.fingerprint([log], for_rerun=True)
    record = tmp_path / "out" / WORK_DIR / RUN_RECORD
    record.parent.mkdir(parents=True)
    older = {**fp, "inputs": [{k: v for k, v in fp["inputs"][0].items() if k != SAMPLE_KEY}]}
    record.write_text(json.dumps(older))
    check_fingerprint(cfg.out, fp)  # not refused
    assert json.loads(record.read_bytes()) == fp
    log.write_text("0\t2\n")  # other content: its size, and here its time, kept
    other = cfg.fingerprint([log], for_rerun=True)
    other["inputs"][0]["mtime_ns"] = fp["inputs"][0]["mtime_ns"]
    with pytest.raises(ValueError, match=r"different inputs \(train\.txt: other content of the "):
        check_fingerprint(cfg.out, other)


def test_the_digest_of_a_large_file_reads_a_few_mib_of_it(tmp_path: Path, monkeypatch):
    """A rerun of unchanged inputs must not read them whole: 1 GiB (sparse), 4 MiB read."""
    big = tmp_path / "day_0"
    with big.open("wb") as f:
        f.truncate(1 << 30)
    read = []
    real_open = Path.open

    def counted(self, *args, **kwargs):
        f = real_open(self, *args, **kwargs)
        real_read = f.read
        f.read = lambda n=-1: read.append(len(data := real_read(n))) or data
        return f

    monkeypatch.setattr(Path, "open", counted)
    sampled_sha256(big)
    assert sum(read) == SAMPLED_BYTES == 4 << 20
