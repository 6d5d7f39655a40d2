"""The overhead governor's bookkeeping (collector/governor.py), driven by hand: which periods it writes when, and
that each tracing_cost row's launch_duty agrees with the probe_gaps rows it wrote. The probes themselves are
tests/collector/test_collector_cost.py's business (eBPF)."""

from __future__ import annotations

import time

import numpy as np

from ingero_mcp.collector.calibrate import ProbeCost
from ingero_mcp.collector.governor import PERIOD_NS, Governor


def _governor() -> Governor:
    costs = {"entry": ProbeCost("entry", 500.0, "test"), "entry_return": ProbeCost("entry_return", 900.0, "test")}
    gov = Governor(costs, 0.01, lambda _on: None, windowed=True, offset_ns=0, say=lambda _text: None)
    gov.t0 = 0
    return gov


def _launches(gov: Governor, *ts: int) -> None:
    gov.count(np.array(ts, np.int64), np.full(len(ts), 7, np.int32), np.ones(len(ts), bool))


def _covered(gov: Governor) -> dict[int, tuple[float, float]]:
    """start_ns -> (the row's launch_duty, 1 minus the share of its period inside the gap rows)."""
    out = {}
    for row in gov.cost_rows:
        start, end = row["start_ns"], row["end_ns"]
        inside = sum(max(0, min(g["end_ns"], end) - max(g["start_ns"], start)) for g in gov.gaps)
        out[start] = (row["launch_duty"], 1 - inside / PERIOD_NS)
    return out


def test_a_period_is_written_only_once_the_gaps_touching_it_are_settled() -> None:
    """A gap opened late in period 0 whose attach ended late in period 1 (a loaded machine: ~1 s to attach) is
    not settled when period 0 would be written (the end of period 1); period 0 waits for it instead of being
    written fully covered, and once settled both rows agree with the gap."""
    gov = _governor()
    gov.t0 = time.monotonic_ns() - 2 * PERIOD_NS - 10_000_000  # now: 10 ms into period 2
    t0 = gov.t0
    _launches(gov, t0 + 100_000_000, t0 + 500_000_000)
    gov._open_gaps.append({"d0": t0 + 850_000_000, "duty": 0.05, "a0": t0 + 1_010_000_000, "a1": t0 + 1_990_000_000})
    _launches(gov, t0 + 1_995_000_000)  # the first launch after the attach
    gov._decide(1)  # the governor thread's step at the end of period 1
    assert gov._open_gaps and gov.gaps == [] and gov.cost_rows == []  # too soon to settle: period 0 waits
    gov.finish()
    covered = _covered(gov)
    assert sorted(covered) == [t0, t0 + PERIOD_NS]
    assert all(abs(duty - share) < 1e-9 for duty, share in covered.values()), covered
    assert abs(covered[t0][0] - 0.85) < 1e-9 and covered[t0 + PERIOD_NS][0] < 0.02, covered


def test_decide_leaves_a_period_with_an_open_gap_unwritten() -> None:
    """The same through _decide, the governor thread's own step."""
    gov = _governor()
    _launches(gov, 100_000_000)
    gov._open_gaps.append({"d0": 900_000_000, "duty": 0.05})  # detached, not attached again yet
    gov._decide(2)
    assert [row["start_ns"] for row in gov.cost_rows] == []
    gov._open_gaps[0].update(a0=2_000_000_000, a1=2_010_000_000)
    gov.finish()
    covered = _covered(gov)
    assert list(covered) == [0] and abs(covered[0][0] - 0.9) < 1e-9 and abs(covered[0][1] - 0.9) < 1e-9, covered
