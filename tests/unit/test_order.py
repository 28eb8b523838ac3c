import numpy as np
import pytest

from shardrec.dataloader.order import (
    NO_SHUFFLE,
    WINDOWS_KEPT,
    EpochOrder,
    OrderSpec,
    ShuffleSpec,
    shuffle_quality,
)


def _spec(tail: str = "drop", shuffle: bool = True, **levels) -> OrderSpec:
    mix = ShuffleSpec(
        enabled=shuffle, **{"seed": 3, "block_rows": 100, "window_blocks": 4, **levels}
    )
    return OrderSpec((1000, 37, 500), global_batch_size=64, tail=tail, shuffle=mix)


@pytest.mark.parametrize("levels", [{}, {"segment_blocks": 2, "group_segments": 3}])
def test_shuffled_epoch_is_a_permutation_of_every_row(levels):
    spec = _spec(**levels)
    rows = EpochOrder(spec, 0).rows(0, spec.num_samples)
    assert sorted(rows.tolist()) == list(range(spec.num_samples))
    assert not np.array_equal(rows, np.arange(spec.num_samples))


def test_order_is_a_pure_function_of_seed_and_epoch():
    spec = _spec()
    a, b = (
        EpochOrder(spec, 1).rows(0, spec.num_samples),
        EpochOrder(spec, 1).rows(0, spec.num_samples),
    )
    assert np.array_equal(a, b)
    assert not np.array_equal(a, EpochOrder(spec, 2).rows(0, spec.num_samples))
    assert not np.array_equal(a, EpochOrder(_spec(seed=4), 1).rows(0, spec.num_samples))


@pytest.mark.parametrize("levels", [{}, {"segment_blocks": 2, "group_segments": 3}])
def test_random_access_equals_sequential_reading(levels):
    spec = _spec(**levels)
    order = EpochOrder(spec, 0)
    whole = order.rows(0, spec.num_samples)
    fresh = EpochOrder(spec, 0)
    # Backwards, across window boundaries: every range agrees with the full stream.
    for start in range(spec.num_samples - 50, 0, -173):
        assert np.array_equal(fresh.rows(start, start + 50), whole[start : start + 50])


def test_no_shuffle_keeps_file_order():
    spec = _spec(shuffle=False)
    assert np.array_equal(
        EpochOrder(spec, 5).rows(0, spec.num_samples), np.arange(spec.num_samples)
    )


def test_batch_counts_for_drop_and_pad():
    assert _spec(tail="drop").num_batches == 1537 // 64
    assert _spec(tail="pad").num_batches == 1537 // 64 + 1
    spec = _spec(tail="pad")
    order = EpochOrder(spec, 0)
    rows, real = order.batch(spec.num_batches - 1)
    assert len(rows) == 64 and real == 1537 % 64
    # Padding repeats the start of the stream.
    assert np.array_equal(rows[real:], order.rows(0, 64 - real))


def test_pad_fills_a_split_smaller_than_one_batch():
    spec = OrderSpec((5,), global_batch_size=16, tail="pad", shuffle=NO_SHUFFLE)
    rows, real = EpochOrder(spec, 0).batch(0)
    assert real == 5 and rows.tolist() == [0, 1, 2, 3, 4] * 3 + [0]


def test_blocks_never_straddle_parts():
    # One block per window: each window's rows must come from one block inside one part.
    spec = _spec(window_blocks=1)
    rows = EpochOrder(spec, 0).rows(0, spec.num_samples)
    starts = np.array([0, 1000, 1037])
    window_start = 0
    while window_start < len(rows):
        first = rows[window_start]
        part = np.searchsorted(starts, first, side="right") - 1
        block = (first - starts[part]) // 100
        length = min(100, spec.part_rows[part] - block * 100)
        window = rows[window_start : window_start + length]
        assert set(window.tolist()) == set(
            range(starts[part] + block * 100, starts[part] + block * 100 + length)
        )
        window_start += length


def test_bad_spec_values_are_named():
    with pytest.raises(ValueError, match="tail must be one of drop, pad, got 'wrap'"):
        _spec(tail="wrap")
    with pytest.raises(ValueError, match="global_batch_size must be positive"):
        OrderSpec((10,), global_batch_size=0)
    with pytest.raises(ValueError, match="window_blocks must be positive, got 0"):
        _spec(window_blocks=0)
    with pytest.raises(TypeError, match="shuffle must be a ShuffleSpec, got False"):
        OrderSpec((10,), global_batch_size=2, shuffle=False)


def test_shuffle_quality_close_to_full_permutation_on_drifting_labels():
    # Labels drift with the file position (as Criteo's click rate drifts with time of day).
    n = 1 << 18
    rng = np.random.default_rng(0)
    rate = 0.25 + 0.15 * np.sin(np.arange(n) / n * 12 * np.pi)
    labels = (rng.random(n) < rate).astype(np.uint8)
    # Scaled-down defaults: a batch mixes rows of 256 blocks (the window), as in production.
    spec = OrderSpec(
        (n,), global_batch_size=1024, shuffle=ShuffleSpec(seed=0, block_rows=256, window_blocks=256)
    )
    q = shuffle_quality(labels, spec)
    assert q["file_order_std"] > 4 * q["full_permutation_std"]
    assert q["ratio"] < 1.2
    coarse = shuffle_quality(
        labels,
        OrderSpec(
            (n,),
            global_batch_size=1024,
            shuffle=ShuffleSpec(seed=0, block_rows=1024, window_blocks=16),
        ),
    )
    assert (
        coarse["ratio"] > q["ratio"]
    )  # fewer, larger blocks per batch mix worse: the measure sees it


def test_order_state_stays_small_for_a_terabyte_dataset():
    # Criteo 1TB: 4.2 B training rows in 23 day files. The order must not hold per-row or
    # per-block tables for all of them (resident memory must not grow with dataset size).
    days = (4_200_000_000 // 23,) * 23
    order = EpochOrder(OrderSpec(days, global_batch_size=65536, shuffle=ShuffleSpec(seed=1)), 0)
    assert (
        order._seg_starts.nbytes + order._seg_lens.nbytes + order._group_starts.nbytes < 2_000_000
    )
    deep = order.rows(3_000_000_000, 3_000_065_536)  # what a resume deep into the epoch needs
    assert len(np.unique(deep)) == 65536 and deep.min() >= 0 and deep.max() < sum(days)
    group = order._group[1]
    assert group.block_starts.nbytes < 1_000_000
    assert sum(w.nbytes for w in order._windows.values()) <= WINDOWS_KEPT * 8 * 65536


def test_pad_adds_no_batch_when_the_rows_divide_by_the_batch():
    """tail="pad" pads only a partial last batch: 1,536 rows in batches of 64 are 24 full batches,
    not 24 and one of padding only."""
    spec = OrderSpec((1000, 36, 500), global_batch_size=64, tail="pad", shuffle=NO_SHUFFLE)
    assert spec.num_batches == 24 == OrderSpec((1000, 36, 500), 64, tail="drop").num_batches
    order = EpochOrder(spec, 0)
    assert [order.batch(k)[1] for k in range(spec.num_batches)] == [64] * 24
    with pytest.raises(IndexError):
        order.batch(24)


def test_the_order_of_segments_changes_with_the_epoch():
    """Every level of the shuffle depends on the epoch, the segments' too: with one segment per
    group, the stream's first 200 rows are the rows of one 200-row segment, and which segment comes
    first must change from epoch to epoch (not only the order of the rows inside it)."""
    mix = ShuffleSpec(seed=3, block_rows=100, window_blocks=4, segment_blocks=2, group_segments=1)
    spec = OrderSpec((1000, 400, 600), global_batch_size=64, shuffle=mix)  # ten 200-row segments
    first = [frozenset(EpochOrder(spec, epoch).rows(0, 200).tolist()) for epoch in range(4)]
    assert all(max(rows) - min(rows) == 199 for rows in first)  # one segment: 200 consecutive rows
    assert len(set(first)) > 1
    assert first[1] == frozenset(EpochOrder(spec, 1).rows(0, 200).tolist())


def test_the_default_shuffle_is_seed_0_and_the_same_every_run():
    """A job that sets no seed gets one fixed order (seed 0), so two runs of it read the same
    batches."""
    spec = OrderSpec((1000, 37, 500), global_batch_size=64)
    rows = EpochOrder(spec, 0).rows(0, spec.num_samples)
    assert sorted(rows.tolist()) == list(range(spec.num_samples))
    seeded = OrderSpec((1000, 37, 500), global_batch_size=64, shuffle=ShuffleSpec(seed=0))
    assert np.array_equal(rows, EpochOrder(seeded, 0).rows(0, spec.num_samples))


def test_a_global_batch_of_one_sample_is_a_batch_per_row():
    spec = OrderSpec((3, 2), global_batch_size=1, shuffle=NO_SHUFFLE)
    order = EpochOrder(spec, 0)
    assert spec.num_batches == 5
    assert [order.batch(k)[0].tolist() for k in range(5)] == [[0], [1], [2], [3], [4]]


def test_each_bad_value_is_refused_in_one_whole_line():
    with pytest.raises(ValueError, match=r"^tail must be one of drop, pad, got 'wrap'$"):
        _spec(tail="wrap")
    with pytest.raises(TypeError, match=r"^shuffle must be a ShuffleSpec, got False$"):
        OrderSpec((10,), global_batch_size=2, shuffle=False)
    with pytest.raises(ValueError, match=r"^part_rows must not be negative, got \(10, -1\)$"):
        OrderSpec((10, -1), global_batch_size=2)
    with pytest.raises(ValueError, match=r"^epoch must not be negative, got -1$"):
        EpochOrder(_spec(), -1)
    with pytest.raises(ValueError, match=r"^global_batch_size must be positive, got 0$"):
        OrderSpec((10,), global_batch_size=0)
    for name in ("block_rows", "window_blocks", "segment_blocks", "group_segments"):
        with pytest.raises(ValueError, match=rf"^{name} must be positive, got -2$"):
            ShuffleSpec(**{name: -2})


@pytest.mark.parametrize(
    "levels",
    [{"segment_blocks": 2, "group_segments": 3}, {"segment_blocks": 1, "group_segments": 2}],
)
def test_each_group_names_the_parts_and_spans_that_hold_its_rows(levels):
    """The loader opens a group's parts (group_parts) and reads ahead its spans (group_spans)
    before the group's batches come: every row of the group's stream positions must lie in them,
    and together the groups cover the epoch once."""
    spec = _spec(**levels)
    order = EpochOrder(spec, 0)
    part_starts = np.array([0, 1000, 1037])
    segment_rows = 100 * levels["segment_blocks"]
    segments = sum(-(-rows // segment_rows) for rows in spec.part_rows)
    assert order.num_groups == -(-segments // levels["group_segments"]) > 1
    stream = order.rows(0, spec.num_samples)
    groups = np.array([order.group_at(pos) for pos in range(spec.num_samples)])
    assert sorted(set(groups.tolist())) == list(range(order.num_groups))
    for g in range(order.num_groups):
        rows = stream[groups == g]
        parts = np.searchsorted(part_starts, rows, side="right") - 1
        assert order.group_parts(g).tolist() == sorted(set(parts.tolist()))
        span_parts, firsts, lens = order.group_spans(g)
        in_spans = np.zeros(spec.num_samples, bool)
        for part, first, length in zip(span_parts, firsts, lens):
            in_spans[part_starts[part] + first : part_starts[part] + first + length] = True
        assert in_spans[rows].all() and in_spans.sum() == len(rows)
    assert EpochOrder(_spec(shuffle=False), 0).num_groups == 1


@pytest.mark.parametrize("shuffle", [True, False])
def test_an_empty_range_of_positions_holds_no_rows(shuffle: bool):
    """A rank whose share of a batch is empty asks for rows(k, k)."""
    order = EpochOrder(_spec(shuffle=shuffle), 0)
    for k in (0, 700, 1537):
        assert order.rows(k, k).tolist() == []


def test_shuffle_quality_needs_two_batches_and_one_label_per_row():
    spec = OrderSpec((256,), global_batch_size=128, shuffle=ShuffleSpec(block_rows=8))
    labels = (np.arange(256) < 128).astype(np.uint8)  # file order: one batch of 1s, one of 0s
    q = shuffle_quality(labels, spec)
    assert q["file_order_std"] == 0.5 and q["shuffle_std"] < 0.5
    with pytest.raises(ValueError, match=r"^255 labels for 256 samples$"):
        shuffle_quality(labels[:255], spec)
    one_batch = OrderSpec((256,), global_batch_size=256)
    with pytest.raises(
        ValueError,
        match=r"^need at least 2 global batches of 256 to measure spread, have 256 rows$",
    ):
        shuffle_quality(labels, one_batch)
