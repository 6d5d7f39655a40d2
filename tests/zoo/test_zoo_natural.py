"""Jobs with nothing staged (bench/gpu/zoo/natural_*.py), recorded on the H200: each script measured itself (its truth's
`self`: where its main thread's time went, by its own clocks), and the report must agree with those measures and blame
no host-side cause they contradict. Checks written before the recordings were made or read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis.models import Report

NATURAL = REPO / "investigations" / "zoo-natural"
NAMES = sorted(p.name.removesuffix(".truth.json") for p in NATURAL.glob("*.truth.json"))
SHARE_SLACK = 0.10  # the report's share of a thread's time and the script's own, apart by at most this
INPUT = {"waiting-on-workers", "waiting-on-process", "waiting-on-thread"}


@pytest.fixture(scope="module")
def natural_stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, NAMES, tmp_path_factory.mktemp("zoo-natural"))


def _feeder_shares(report: Report, truth: dict) -> dict[str, float]:
    """The feeding thread's time by part over the measured run (baseline_ns), from the report's per-second rows."""
    assert report.accounting is not None
    t = next(t for t in report.accounting.threads if t.tid == truth["feeder"]["tid"])
    lo, hi = truth["baseline_ns"]
    got = [s for s in t.seconds if lo <= s.start_ns and s.start_ns + 1_000_000_000 <= hi]
    wall = sum(s.wall_ns for s in got)
    parts = ("sleep_outside_ns", "sleep_inside_ns", "run_inside_ns", "run_outside_ns", "cpu_wait_ns")
    return {p: sum(getattr(s, p) for s in got) / wall for p in parts}


def check_lm_loader(report: Report, truth: dict) -> None:
    """The main thread's wait in next() is its sleep outside CUDA calls (within SHARE_SLACK); a job that waited on its
    loader a third of the time or more is said input-bound first; one that waited under a tenth is not said so."""
    own = truth["self"]
    shares = _feeder_shares(report, truth)
    assert abs(shares["sleep_outside_ns"] - own["wait_share"]) <= SHARE_SLACK, (shares, own)
    top = _top(report)
    if own["wait_share"] >= 0.33:
        assert top and top[0].root_cause in INPUT, [c.summary for c in top]
    elif own["wait_share"] < 0.10:
        assert not any(c.root_cause in INPUT for c in top), [c.summary for c in top]


def check_eval_ckpt(report: Report, truth: dict) -> None:
    """No HIGH or MEDIUM chain whose window lies within an evaluation pass blames the host (the GPU's own work); a
    chain that lies within the checkpoints explains no more than the script measured them to take (plus a second)."""
    evals, ckpts = truth["evals_ns"], truth["ckpts_ns"]
    host = {"cpu-contention", "own-threads-cpu", "gil-or-lock", "timed-sleep", "launch-bound", "excess-sync",
            "waiting-on-workers", "waiting-on-thread", "waiting-on-process"}

    def inside(w, spans: list) -> bool:
        return any(a - 1_000_000_000 <= w.start_ns and w.end_ns <= b + 1_000_000_000 for a, b in spans)

    for chain in _top(report):
        if chain.window and inside(chain.window, evals) and not inside(chain.window, ckpts):
            assert chain.root_cause not in host, chain.summary
    in_ckpt = [c for c in _top(report) if c.window and all(
        any(a - 1_000_000_000 <= w.start_ns and w.end_ns <= b + 1_000_000_000 for a, b in ckpts)
        for w in [c.window])]
    assert sum(c.seconds_lost or 0 for c in in_ckpt) <= truth["self"]["ckpt_s"] + 1.0, [c.summary for c in in_ckpt]


CHECKS = {"natural_lm_loader": check_lm_loader, "natural_eval_ckpt": check_eval_ckpt}


def test_every_natural_store_has_its_check() -> None:
    assert set(NAMES) == set(CHECKS), NAMES


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_report_agrees_with_what_the_job_measured(natural_stores: Path, name: str) -> None:
    truth = json.loads((NATURAL / f"{name}.truth.json").read_text())
    CHECKS[name](_report(natural_stores, name), truth)
