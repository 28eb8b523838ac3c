"""Calibration profiles: the lookup measurement runs, and a profile's figures reach the topology."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardrec.sharding.topology import build_topology
from shardrec.tools.bench.calibrate import measure_lookup, save_profile


def test_lookup_measurement_is_positive() -> None:
    got = measure_lookup("cpu", rows=2000, dim=8, batch=64, pooling=2, repeats=2)
    # The bandwidth is the rows read (batch x pooling x dim x 4 bytes) over the forward time.
    assert got["lookup_bytes"] == 64 * 2 * 8 * 4
    assert got["lookup_fwd_s"] > 0
    assert got["lookup_bw"] == pytest.approx(got["lookup_bytes"] / got["lookup_fwd_s"])


def test_profile_figures_reach_the_topology(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    save_profile(
        {
            "format": "shardrec-calibration",
            "measured": {"lookup_bw": 1.5e9, "intra_host_bw": 3e8, "collective_latency_s": 4e-4},
        },
        path,
    )
    topo = build_topology("cpu-gloo", 2, profile=path)
    assert (topo.lookup_bw, topo.intra_host_bw, topo.collective_latency_s) == (1.5e9, 3e8, 4e-4)
    assert topo.inter_host_bw == build_topology("cpu-gloo", 2).inter_host_bw


def test_bad_profiles_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"measured": {"lookup_bw": -1}}))
    with pytest.raises(ValueError, match=f"{path}: measured.lookup_bw = -1 must be a positive number"):
        build_topology("cpu-gloo", 2, profile=path)
    path.write_text(json.dumps({"something": 1}))
    with pytest.raises(ValueError, match="no 'measured' section"):
        build_topology("cpu-gloo", 2, profile=path)
    with pytest.raises(ValueError, match="preset 'tpu' is not one of"):
        build_topology("tpu", 2)
