"""What every natural job's check reads from the report: the feeding thread's time by part over the measured run,
set against the script's own shares within SHARE_SLACK (test_zoo_natural and natural_checks_*); and the few ways of
reading findings the later groups' checks share (said, seconds, people, in_run, gpu_busy_rules, scaled,
capped, own_lead)."""

from __future__ import annotations

from test_zoo import SECOND, _top

from ingero_mcp.analysis.models import CausalChain, Report

NOT_A_TASK = ("kernel", "interrupt")  # culprit relations that name no process

SHARE_SLACK = 0.10  # the report's share of a thread's time and the script's own, apart by at most this

# The causes and thresholds the checks of groups 11 to 14 read alike.
INPUT = {"waiting-on-workers", "waiting-on-process", "waiting-on-thread"}
HOST_SIDE = {"launch-bound", "host-bound", "excess-sync"}
CHURN = {"allocator-churn", "driver-lock"}  # memory allocated and released (device or page-locked host) per step
# Where the truth says whether a cause was there at all: from these rates over the run it may be named.
PAGE_FAULTS_PER_S = 10_000.0  # a process's minor page faults a second
HOST_ALLOCS_PER_S = 2.0  # the caching host allocator's cudaHostAlloc calls a second (num_host_alloc)
CUDA_MALLOCS_PER_S = 10.0  # the device allocator's cudaMalloc calls a second (segment.all.allocated)
CPU_WAIT_SHARE = 0.05  # a thread's wait for a CPU (schedstat run delay), as a share of the run
STARVED_SHARE = 0.10  # a worker's wait for a CPU (schedstat), as a share of the run (of its life), from which starved


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


def people(c: CausalChain) -> list:
    """A chain's culprits that are tasks (not the kernel or an interrupt)."""
    return [k for k in c.culprits if k.relation not in NOT_A_TASK]


def said(chains: list[CausalChain]) -> list[str]:
    return [f"{c.severity} {c.root_cause}: {c.summary}" for c in chains]


def seconds(chains: list[CausalChain], causes: set[str] | None = None) -> float:
    return sum(c.seconds_lost or 0.0 for c in chains if causes is None or c.root_cause in causes)


def in_run(report: Report, truth: dict) -> list[CausalChain]:
    """The HIGH and MEDIUM findings held to the measured run (truth baseline_ns): those whose window overlaps it by over
    half a second, or that have none (the set-up before it or what follows it)."""
    lo, hi = truth["baseline_ns"]
    return [c for c in _top(report)
            if c.window is None or min(c.window.end_ns, hi) - max(c.window.start_ns, lo) > SECOND // 2]


def gpu_busy_rules(top: list[CausalChain], own: dict, lead: set[str], host: set[str]) -> None:
    """GPU busy (the script's kernels measured queued, over the run) under 40%: the report leads with the host side
    (`lead`) and says nothing gpu-bound; 80% or more: the host side (`host`) explains no more than the GPU's idle time
    plus half a second."""
    busy = own["gpu_busy_share"]
    assert busy is not None, "the script did not measure the GPU's time"
    if busy < 0.4:
        assert top and top[0].root_cause in lead, (said(top), own)
        assert not any(c.root_cause == "gpu-bound" for c in top), said(top)
    elif busy >= 0.8:
        assert seconds(top, host) <= (1 - busy) * own["wall_s"] + 0.5, (said(top), own)


def scaled(measured_s: float, chains: list[CausalChain], wall: float) -> float:
    """A budget measured over the run (`wall` s), stretched to the longest window of `chains` where that is longer: a
    finding may span the warm-up's last seconds too, where the job did the same (natural11's revision)."""
    span = max([wall] + [(c.window.end_ns - c.window.start_ns) / SECOND for c in chains if c.window])
    return measured_s * span / wall if wall else measured_s


def capped(chains: list[CausalChain], causes: set[str], measured_s: float, own: dict) -> None:
    """The findings of `causes` explain no more than `measured_s` (over their windows) plus half a second."""
    got = [c for c in chains if c.root_cause in causes]
    assert seconds(got) <= scaled(measured_s, got, own["wall_s"]) + 0.5, (said(got), sorted(causes), own)


def own_lead(top: list[CausalChain], lead: set[str], pid: int, own: dict) -> None:
    """The report leads with one of `lead`, said of the job's process."""
    assert top and top[0].root_cause in lead, (said(top), sorted(lead), own)
    assert pid in top[0].pids or any(k.pid == pid for k in people(top[0])), (top[0].summary, top[0].pids, pid)
