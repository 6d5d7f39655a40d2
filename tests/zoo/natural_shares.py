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


def shares_agree(shares: dict[str, float], own: dict) -> None:
    """The main thread's time on a CPU and waiting for one over the measured run, by its own clocks (schedstat's exec
    runtime and run delay: `main_cpu_share`, `main_cpu_wait_share`), is the report's (running inside and outside CUDA
    calls; waiting for a CPU) within SHARE_SLACK."""
    run = shares["run_inside_ns"] + shares["run_outside_ns"]
    assert abs(run - own["main_cpu_share"]) <= SHARE_SLACK, (shares, own["main_cpu_share"])
    if own.get("main_cpu_wait_share") is not None:
        assert abs(shares["cpu_wait_ns"] - own["main_cpu_wait_share"]) <= SHARE_SLACK, (shares, own)


def clocks_agree(report: Report, truth: dict) -> dict[str, float]:
    """shares_agree over the report's feeder_shares; returns those shares."""
    shares = feeder_shares(report, truth)
    shares_agree(shares, truth["self"])
    return shares
