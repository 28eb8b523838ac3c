"""One large .gz file split across workers: a planning pass cuts its text into line-aligned ranges.

The pass inflates the file once and cuts its text exactly as chunk_bounds cuts a plain file
(a range ends after the first newline at or past start + chunk_bytes), counting each range's lines
and taking its CRC-32; with rapidgzip it also writes a seek index. Ranges are then tasks like a
plain file's, so the output does not depend on the worker count, and a range decoded through the
index is checked against its CRC before its rows count. The pass's result and the index are kept
under the output's .work directory (written atomically) and reused by a rerun of the same input.

Which files are split (inputs.plan_tasks): those whose lines must be counted anyway (Kaggle's
one file, the last day of a days layout, halved into val/test) and of at least SPLIT_MIN_CHUNKS x
chunk_bytes compressed; the pass then takes the place of the count. A training day among many
stays one task, as the days already spread over the workers file by file.

Where it can, a run does not take this pass: gz_stream.py decodes the file once and hands each
range's text to a worker as it goes (the same cut, saved in the same record). The pass remains for
what cannot stream: vocabulary mode (its counting pass reads the ranges, then the id pass again,
through the seek index) and --part runs (each machine takes its share of a planned cut). It is one
sequential decode (rapidgzip on one thread, ~480 MB per CPU-second here with the cutting and CRCs)
before any worker starts, and every range is decoded again by its task.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.tools.preprocess.text import gz
from shardrec.tools.preprocess.text.lines import TSV_BLANK, RowEnd, TextEnd

logger = logging.getLogger(__name__)
SPLIT_MIN_CHUNKS = 4
SCAN_VERSION = 3  # 2: a quoting spec's ranges end where a row ends, not inside a quoted field;
# 3: the blank lines that end the text are left out
_BLOCK = 16 << 20


@dataclass(frozen=True)
class GzipScan:
    """Where a .gz file's text is cut: ranges [start, end) of text bytes, their lines and
    CRC-32s."""

    bounds: list[tuple[int, int]]
    counts: list[int]
    crcs: list[int]
    total_lines: int  # physical lines after any header (a last line without a newline counts)
    index: str  # path of the seek index, "" when there is none


def should_split(path: Path, chunk_bytes: int) -> bool:
    return path.stat().st_size >= SPLIT_MIN_CHUNKS * chunk_bytes


class _Cutter:
    """Consumes the text block by block and closes a range at the first newline at or past its
    target (with row_end: the first that ends a row). The blank lines that end the text are left
    out (text.lines): where they begin, the last range ends."""

    def __init__(
        self, chunk_bytes: int, header: bool, row_end: RowEnd | None, blank: bytes
    ) -> None:
        self.chunk, self.pos, self.begin = chunk_bytes, 0, -1 if header else 0
        self.rows = None if row_end is None else _RowCuts(row_end)
        self.target = self.begin + chunk_bytes if self.begin >= 0 else -1
        self.bounds: list[tuple[int, int]] = []
        self.counts: list[int] = []
        self.crcs: list[int] = []
        self.lines = self.crc = 0
        self.last = b"\n"
        # Where the last line that is not blank ends: its range, and that range's lines and CRC-32
        # up to it.
        self.end, self.kept = TextEnd(blank), (max(self.begin, 0), 0, 0, 0)

    def feed(self, block: memoryview) -> None:
        data, at = block.obj if isinstance(block.obj, bytearray) else bytes(block), 0
        n = len(block)
        if self.begin < 0:  # the header ends at the first newline; it belongs to no range
            nl = data.find(b"\n", 0, n)
            if nl < 0:
                self.pos += n
                return
            at, self.begin = nl + 1, self.pos + nl + 1
            self.target = self.begin + self.chunk
            self.kept = (self.begin, 0, 0, 0)
        while at < n:
            if self.rows is not None:
                cut = self.rows.cut(block, at, self.target - self.pos)
            elif self.target - self.pos < n:
                cut = data.find(b"\n", max(at, self.target - self.pos), n)
            else:
                cut = -1
            stop = cut + 1 if cut >= 0 else n
            keep = self.end.feed(data, at, stop)
            if keep >= 0:
                self._add(data, block, at, keep)
                self.kept = (self.pos + keep, len(self.bounds), self.lines, self.crc)
                at = keep
            self._add(data, block, at, stop)
            at = stop
            if cut >= 0:
                self._close(self.pos + stop)
        self.last = bytes(block[n - 1 : n]) if n else self.last
        self.pos += n

    def _add(self, data, block: memoryview, a: int, b: int) -> None:
        self.lines += data.count(b"\n", a, b)
        self.crc = gz.crc32(block[a:b], self.crc)

    def _close(self, end: int) -> None:
        start = self.bounds[-1][1] if self.bounds else self.begin
        self.bounds.append((start, end))
        self.counts.append(self.lines)
        self.crcs.append(self.crc)
        self.lines = self.crc = 0
        self.target = end + self.chunk

    def finish(self) -> tuple[list[tuple[int, int]], list[int], list[int], int]:
        if self.begin < 0:  # a header and nothing after it
            return [], [], [], 0
        if self.last != b"\n" and not self.end.last_line_blank():
            if self.pos > (self.bounds[-1][1] if self.bounds else self.begin):
                self._close(self.pos)
            return self.bounds, self.counts, self.crcs, sum(self.counts) + 1
        # The text ends with its last line that is not blank: in the range it falls in, cut there.
        end, k, lines, crc = self.kept
        del self.bounds[k:], self.counts[k:], self.crcs[k:]
        if end > (self.bounds[-1][1] if self.bounds else self.begin):
            self.lines, self.crc = lines, crc
            self._close(end)
        return self.bounds, self.counts, self.crcs, sum(self.counts)


class _RowCuts:
    """Where a row ends in text fed block by block (a quoted field may hold line breaks): the
    lines are read once, each block after the unfinished line the one before it left."""

    def __init__(self, row_end: RowEnd) -> None:
        self.row_end, self.tail, self.inside = row_end, b"", False

    def cut(self, block: memoryview, at: int, target: int) -> int:
        """The newline in block[at:] that ends the first row ending at or past `target` (block
        offsets), or -1; a row starts at `at` unless the text before it left a quote open."""
        rest = block[at:]
        text = np.frombuffer(self.tail + bytes(rest) if self.tail else rest, dtype=np.uint8)
        lead = len(self.tail) - at  # text offset of block offset 0
        cut, stop, self.inside = self.row_end(text, 0, target + lead, self.inside)
        if cut >= 0:
            self.tail = b""
            return cut - 1 - lead
        self.tail = text[stop:].tobytes()
        return -1


def _read_all(reader, cutter: _Cutter) -> int:
    buf, total = bytearray(_BLOCK), 0
    while n := reader.readinto(buf):
        cutter.feed(memoryview(buf)[:n])
        total += n
    return total


def _scan(
    path: Path,
    chunk_bytes: int,
    header: bool,
    index: Path | None,
    row_end: RowEnd | None,
    blank: bytes,
) -> GzipScan:
    """One pass over the text; through rapidgzip (writing the index) when it can, else open_gzip."""
    if index is not None and gz.can_index():
        cutter = _Cutter(chunk_bytes, header, row_end, blank)
        try:
            with gz.open_indexing(path) as reader:
                total = _read_all(reader, cutter)
                if gz.trailer_size_matches(path, total):
                    gz.export_index(reader, index)
                    return GzipScan(*cutter.finish(), index=str(index))
            logger.info(
                "%s: the trailer's size differs from the text read: rescanned without a seek index",
                path,
            )
        except gz.RAPIDGZIP_ERRORS as e:  # the sequential decoder below names the damage as usual
            logger.info(
                "%s: rapidgzip could not read it (%s): rescanned without a seek index", path, e
            )
    cutter = _Cutter(chunk_bytes, header, row_end, blank)
    try:
        f = gz.open_gzip(path)
    except gz.READ_ERRORS as e:
        raise ValueError(gz.describe_error(path, e)) from e
    with f:
        try:
            _read_all(f, cutter)
        except gz.READ_ERRORS as e:
            raise ValueError(gz.describe_error(path, e, f)) from e
    return GzipScan(*cutter.finish(), index="")


def scan_gzip(
    path: Path,
    number: int,
    chunk_bytes: int,
    header: bool,
    work_dir: Path | None,
    row_end: RowEnd | None = None,
    blank: bytes = TSV_BLANK,
) -> GzipScan:
    """The cut of input file `number` (its position among the inputs), from work_dir when a run
    already scanned this very file (name, size, mtime) with these options, else by a pass.
    row_end: ranges end where it finds a row's end (quoted fields may hold line breaks); blank:
    what a blank line holds (text.lines.blank_bytes)."""
    if work_dir is None:
        return _scan(path, chunk_bytes, header, None, row_end, blank)
    scan = load_scan(path, number, chunk_bytes, header, work_dir)
    if scan is None:
        stem = _stem(work_dir, number, path)
        stem.parent.mkdir(parents=True, exist_ok=True)
        index = stem.with_suffix(stem.suffix + ".gzidx")
        scan = _scan(path, chunk_bytes, header, index, row_end, blank)
        save_scan(path, number, chunk_bytes, header, work_dir, scan)
    return scan


def _stem(work_dir: Path, number: int, path: Path) -> Path:
    return work_dir / "gzip" / f"{number:03d}-{path.name}"


def _key(path: Path, chunk_bytes: int, header: bool) -> dict:
    st = path.stat()
    return {
        "version": SCAN_VERSION,
        "bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "chunk_bytes": chunk_bytes,
        "header": header,
    }


def _record(work_dir: Path, number: int, path: Path) -> Path:
    stem = _stem(work_dir, number, path)
    return stem.with_suffix(stem.suffix + ".json")


def load_scan(
    path: Path, number: int, chunk_bytes: int, header: bool, work_dir: Path
) -> GzipScan | None:
    """The cut a run saved for this very file (name, size, mtime) and options, or None."""
    try:
        saved = json.loads(_record(work_dir, number, path).read_bytes())
        if saved["key"] == _key(path, chunk_bytes, header) and (
            not saved["scan"]["index"] or Path(saved["scan"]["index"]).is_file()
        ):
            scan = saved["scan"]
            return GzipScan(
                [tuple(b) for b in scan["bounds"]],
                scan["counts"],
                scan["crcs"],
                scan["total_lines"],
                scan["index"],
            )
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, torn, or from another file: scanned again
    return None


def save_scan(
    path: Path, number: int, chunk_bytes: int, header: bool, work_dir: Path, scan: GzipScan
) -> None:
    record = _record(work_dir, number, path)
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(
        record, json.dumps({"key": _key(path, chunk_bytes, header), "scan": asdict(scan)}).encode()
    )
