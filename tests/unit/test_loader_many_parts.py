"""The loader on many parts: past 256 parts (part indices leave uint8), parts unmapped and mapped
again (a bounded number mapped at a time), no file descriptor held per map, and one clear line
when the open-file limit is reached anyway."""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import resource
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_dataset
from dataset_writing import resplit

from shardrec.dataloader.digest import batch_digest
from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.dataloader.format.part_cache import PartSet
from shardrec.dataloader.format.source import open_source
from shardrec.dataloader.gather import gather_kernels
from shardrec.dataloader.gather.addresses import index_dtype
from shardrec.dataloader.loader import Delivery, ShuffleSpec, build_loader
from shardrec.dataloader.util.mapping import map_npy, read_ahead_spans

PARTS = 300
SMALL_SHUFFLE = ShuffleSpec(
    seed=3, block_rows=4, window_blocks=8, segment_blocks=2, group_segments=40
)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("many")
    write_tiny_dataset(root / "one", rows={"train": [900]})
    resplit(root / "one", root / "many", PARTS)
    return root / "one", root / "many"


def _digests(
    directory: Path, shuffle: ShuffleSpec, delivery: Delivery = Delivery(), batch: int = 40
) -> list[str]:
    loader = build_loader(
        directory,
        "train",
        global_batch_size=batch,
        rank=0,
        world_size=1,
        shuffle=shuffle,
        delivery=delivery,
    )
    return [batch_digest([b], loader.feature_names) for b in loader]


@pytest.mark.parametrize("compiled", [True, False] if gather_kernels.AVAILABLE else [False])
def test_past_256_parts_batches_are_the_one_part_rows(datasets, compiled: bool):
    one, many = datasets
    loader = build_loader(
        many,
        "train",
        global_batch_size=40,
        rank=0,
        world_size=1,
        shuffle=ShuffleSpec(enabled=False),
    )
    starts = np.cumsum([0, *loader.source.part_rows])
    # Some batch holds rows of parts 255 and 256 (where a part index leaves uint8) and many more.
    assert any(k * 40 < starts[256] <= (k + 1) * 40 - 1 for k in range(len(loader)))
    assert index_dtype(PARTS) == np.uint16  # the whole-epoch gather below holds 300 parts
    off = ShuffleSpec(enabled=False)
    assert _digests(many, off, Delivery(compiled=compiled)) == _digests(
        one, off, Delivery(compiled=compiled)
    )
    # A gather of all rows at once: one pass of the several-parts kernels over every part.
    whole = Delivery(compiled=compiled, gather_rows=900)
    assert _digests(many, off, whole, batch=900) == _digests(one, off, whole, batch=900)


@pytest.fixture(scope="module")
def shuffled(datasets) -> list[str]:
    """The shuffled stream of the many-part dataset with every part mapped."""
    return _digests(datasets[1], SMALL_SHUFFLE)


@pytest.mark.parametrize("compiled", [True, False] if gather_kernels.AVAILABLE else [False])
def test_a_few_mapped_parts_give_the_same_shuffled_stream(datasets, shuffled, compiled: bool):
    few = Delivery(compiled=compiled, max_mapped_parts=5, gather_rows=80)
    assert _digests(datasets[1], SMALL_SHUFFLE, few) == shuffled


def test_prefetch_threads_share_a_few_mapped_parts(datasets, shuffled):
    threads = Delivery(max_mapped_parts=3, gather_rows=40, num_workers=3, prefetch=2)
    assert _digests(datasets[1], SMALL_SHUFFLE, threads) == shuffled


def test_parts_are_unmapped_beyond_the_bound(datasets):
    _, many = datasets
    source = open_source(many, "train", max_mapped_parts=5)
    assert (
        source.parts.mapped == 1 and source.parts.opens == 1
    )  # the others are mapped as the stream reaches them
    loader = build_loader(
        many,
        "train",
        global_batch_size=40,
        rank=0,
        world_size=1,
        shuffle=SMALL_SHUFFLE,
        delivery=Delivery(max_mapped_parts=5),
    )
    for _ in loader:
        pass
    parts = loader.source.parts
    del source
    assert parts.mapped <= 5 and parts.opens > 5  # parts were evicted as the stream came to others
    assert _maps_of(many) <= 5  # one map per part


def _maps_of(directory: Path) -> int:
    """Memory maps of the process whose file lies in `directory` (a part is one map)."""
    return sum(
        1 for line in Path("/proc/self/maps").read_text().splitlines() if str(directory) in line
    )


def _stream_mapped(
    directory: Path, shuffle: ShuffleSpec, passes: int = 1
) -> tuple[list[str], list[int], list[int]]:
    """Digests of the stream in one-batch runs, the parts mapped by the set as each batch arrives,
    and the process's maps of the dataset then (the set's, and those the gathers hold), over
    `passes` passes of one epoch (as an eval loader goes at every evaluation)."""
    loader = build_loader(
        directory,
        "train",
        global_batch_size=40,
        rank=0,
        world_size=1,
        shuffle=shuffle,
        delivery=Delivery(gather_rows=40),
    )
    digests, mapped, maps = [], [], []
    for _ in range(passes):
        for batch in loader:
            mapped.append(loader.source.parts.mapped)
            maps.append(_maps_of(directory))
            digests.append(batch_digest([batch], loader.feature_names))
    return digests, mapped, maps


def test_the_shuffled_stream_unmaps_the_groups_it_has_left(datasets, shuffled):
    # A mapped part keeps the pages read through it in the process's RSS: only the current shuffle
    # group's parts (40 here, and the previous group's while a run straddles the boundary) stay.
    digests, mapped, maps = _stream_mapped(datasets[1], SMALL_SHUFFLE)
    assert digests == shuffled
    assert (
        max(mapped) <= 2 * SMALL_SHUFFLE.group_segments < PARTS
        and mapped[-1] <= SMALL_SHUFFLE.group_segments + 1
    )
    # The gathers hold a group's parts from window to window, and let them go with the set's:
    # the process maps no more than the set does.
    assert max(maps) <= 2 * SMALL_SHUFFLE.group_segments


def test_the_stream_in_file_order_unmaps_the_parts_it_has_left(datasets):
    off = ShuffleSpec(enabled=False)
    digests, mapped, _ = _stream_mapped(datasets[1], off)
    assert digests == _digests(datasets[0], off)  # the one-part dataset's rows, in order
    assert (
        max(mapped) <= 40 + 1 < PARTS
    )  # a batch's 40 rows lie in 40 parts at most, and one left from before


@pytest.mark.parametrize(
    "shuffle", [SMALL_SHUFFLE, ShuffleSpec(enabled=False)], ids=["shuffled", "in order"]
)
def test_a_second_pass_of_one_epoch_unmaps_as_the_first(datasets, shuffle):
    # An eval loader goes over epoch 0 at every evaluation: from its second pass on, the parts it
    # left stayed mapped (all 300 by the end), their pages in every rank's RSS.
    digests, mapped, _ = _stream_mapped(datasets[1], shuffle, passes=3)
    once = len(digests) // 3
    assert digests == digests[:once] * 3
    # (in file order, the last pass's tail parts stay until the stream reaches them again)
    assert max(mapped[once:]) <= 2 * max(mapped[:once]) < PARTS


def test_no_file_descriptor_is_held_per_part(datasets):
    _, many = datasets
    before = len(os.listdir("/proc/self/fd"))
    loader = build_loader(many, "train", global_batch_size=40, rank=0, world_size=1)
    next(iter(loader))
    assert len(os.listdir("/proc/self/fd")) - before < 8  # 300 parts x 6 files were ~1,800 before


def test_map_npy_is_np_load_read_only(tmp_path):
    for array in (
        np.arange(7, dtype=np.uint16),
        np.ones((5, 3), np.float16),
        np.zeros(
            2, [(f"field{i:03d}", np.uint8) for i in range(400)]
        ),  # a header past one pread's 4 KB
        np.zeros((0, 13), np.float32),
        np.asfortranarray(np.eye(3)),
    ):
        np.save(tmp_path / "a.npy", array)
        mapped = map_npy(tmp_path / "a.npy")
        assert (
            mapped.dtype == array.dtype
            and mapped.shape == array.shape
            and np.array_equal(mapped, array)
        )
        assert mapped.flags.c_contiguous == array.flags.c_contiguous and not mapped.flags.writeable
    (tmp_path / "a.npy").write_bytes((tmp_path / "a.npy").read_bytes()[:-8])
    with pytest.raises(ValueError, match="header promises 72 bytes"):
        map_npy(tmp_path / "a.npy")
    for head in (
        b"\x93NUMPY\x01",
        b"\x93NUMPY\x09\x00" + bytes(8),
    ):  # cut inside the magic; unknown version
        (tmp_path / "a.npy").write_bytes(head)
        with pytest.raises(ValueError):
            map_npy(tmp_path / "a.npy")


def test_an_exhausted_open_file_limit_is_one_clear_line(datasets, tmp_path: Path):
    # A copy of its own: a part of the shared dataset may still be mapped by an earlier test's
    # loader (the process-wide map cache serves it without opening its file).
    many = tmp_path / "many"
    resplit(datasets[0], many, 20)
    manifest = Manifest.load(many)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    limit = lowest_free  # a descriptor must be below the limit: no new file can be opened
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        with pytest.raises(DatasetError) as raised:
            PartSet(many, "train", manifest)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    message = str(raised.value)
    assert "\n" not in message and f"the open-file limit is reached (ulimit -n {limit})" in message
    assert "part-00000.arrow: cannot open" in message


def test_all_part_sets_of_the_process_share_one_map_budget(datasets, monkeypatch, tmp_path):
    from shardrec.dataloader.format import part_cache

    # A copy: parts of its own path are no earlier test's. A set of the module's dataset still
    # alive (its loader's warming thread not yet ended, under load) holds the same parts, which
    # then count once and never fill the budget: every set kept all 300 (the full suite, once).
    many = Path(shutil.copytree(datasets[1], tmp_path / "many"))
    # Earlier tests' loaders freed now, not by a collection in the middle of this test (their
    # maps would leave the budget room for more than 20 parts: 22 were seen once).
    gc.collect()
    monkeypatch.setattr(part_cache._BUDGET, "limit", part_cache._BUDGET.maps + 20)  # a map a part
    sets = [open_source(many, "train").parts for _ in range(3)]
    [list(s) for s in sets]  # every part read through each set in turn (no name left holding one)
    assert (
        sum(s.mapped for s in sets) == 20
    )  # the newest set keeps the last 20 parts, the others none
    assert sets[-1].mapped == 20 and sets[-1][0].rows == sets[-1].rows[0]
    ids = {s._id for s in sets}
    assert {k[0] for k in part_cache._BUDGET.order} & ids == {sets[-1]._id}
    del sets
    gc.collect()
    assert not {k[0] for k in part_cache._BUDGET.order} & ids  # dropped sets' maps left the budget
    assert part_cache._BUDGET.maps == len(set(part_cache._BUDGET.order.values()))


def test_loaders_of_one_split_share_its_maps(datasets):
    _, many = datasets
    first, second = open_source(many, "train").parts, open_source(many, "train").parts
    assert second.opens == 0 and second[7] is first[7]  # the second set mapped nothing of its own


def test_the_next_shuffle_group_is_mapped_before_the_stream_reaches_it(datasets, shuffled):
    # Opening a group's parts (and faulting their rows in) inside the gathers halved the stream's
    # rate at Criteo 1TB's part size: a background thread does it while the group before streams.
    loader = build_loader(
        datasets[1],
        "train",
        global_batch_size=40,
        rank=0,
        world_size=1,
        shuffle=SMALL_SHUFFLE,
        delivery=Delivery(gather_rows=40),  # one batch a run: the stream is still in group 0 below
    )
    batches = iter(loader)
    digests = [batch_digest([next(batches)], loader.feature_names)]
    order, parts = loader._epoch_order(), loader.source.parts
    following = order.group_parts(1).tolist()
    assert order.group_at(len(loader) * 40 - 1) > 0 and not set(following) <= set(
        order.group_parts(0).tolist()
    )
    deadline = time.monotonic() + 30
    while not all(parts.holds(i) for i in following) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(parts.holds(i) for i in following)
    assert order.group_at(loader.state_dict()["sample_offset"]) == 0
    digests += [batch_digest([b], loader.feature_names) for b in batches]
    assert digests == shuffled


def _cached_pages(column: np.ndarray) -> int:
    """Pages of the column's map that are in the page cache (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    first = column.ctypes.data - column.ctypes.data % mmap.PAGESIZE
    length = column.ctypes.data + column.nbytes - first
    vec = (ctypes.c_ubyte * -(-length // mmap.PAGESIZE))()
    assert libc.mincore(ctypes.c_void_p(first), ctypes.c_size_t(length), vec) == 0, (
        ctypes.get_errno()
    )
    return sum(v & 1 for v in vec)


def test_read_ahead_brings_the_rows_pages_into_the_page_cache(tmp_path):
    path = tmp_path / "c.npy"
    np.save(path, np.arange(1 << 22, dtype=np.uint8))  # 1,024 pages
    fd = os.open(path, os.O_RDONLY)
    try:  # out of the page cache (written back first: dirty pages stay)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    column = map_npy(path)
    assert _cached_pages(column) < 64
    read_ahead_spans([(column.ctypes.data, column.nbytes // 2)])
    deadline = time.monotonic() + 10  # the reads are started, not waited for
    while _cached_pages(column) < 512 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _cached_pages(column) >= 512


def test_read_ahead_asks_only_for_spans_the_page_cache_does_not_hold(tmp_path):
    # Asking for cached pages walks the page cache (~50 ms of CPU per shuffle group of 256 Criteo
    # parts): the warming thread looks the spans' ends up first.
    path = tmp_path / "c.npy"
    np.save(path, np.arange(1 << 22, dtype=np.uint8))  # 1,024 pages
    path.read_bytes()  # every page cached, none mapped (a mapped page cannot be dropped)
    column = map_npy(path)
    base, page = column.ctypes.data, mmap.PAGESIZE
    spans = [(base + 10 * page, 100 * page), (base + 500 * page + 7, 300 * page)]
    assert read_ahead_spans(spans, probe=True) is False

    fd = os.open(path, os.O_RDONLY)
    try:  # the last span's last pages out of the page cache (from 2 MiB on: whole huge folios)
        os.fsync(fd)
        os.posix_fadvise(fd, 2 << 20, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _cached_pages(column) > 1024 - 100:
        pytest.skip("the kernel kept the pages (POSIX_FADV_DONTNEED is advice)")
    assert read_ahead_spans(spans, probe=True) is True
    deadline = time.monotonic() + 10  # the reads are started, not waited for
    while _cached_pages(column) < 780 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_ahead_spans(spans, probe=True) is False
