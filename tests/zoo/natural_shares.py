"""What every natural job's check reads from the report: the feeding thread's time by part over the measured run,
set against the script's own shares within SHARE_SLACK (test_zoo_natural and natural_checks_*)."""

from __future__ import annotations

from test_zoo import SECOND

from ingero_mcp.analysis.models import Report

SHARE_SLACK = 0.10  # the report's share of a thread's time and the script's own, apart by at most this


def feeder_shares(report: Report, truth: dict) -> dict[str, float]:
    """The feeding thread's time by part over the measured run (baseline_ns), from the report's per-second rows."""
    assert report.accounting is not None
    t = next(t for t in report.accounting.threads if t.tid == truth["feeder"]["tid"])
    lo, hi = truth["baseline_ns"]
    got = [s for s in t.seconds if lo <= s.start_ns and s.start_ns + SECOND <= hi]
    wall = sum(s.wall_ns for s in got)
    parts = ("sleep_outside_ns", "sleep_inside_ns", "run_inside_ns", "run_outside_ns", "cpu_wait_ns")
    return {p: sum(getattr(s, p) for s in got) / wall for p in parts}
