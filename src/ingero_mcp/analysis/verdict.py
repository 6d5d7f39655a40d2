"""The verdict: the few lines a user reads first, made from the accounting and the top chains."""

from __future__ import annotations

from typing import NamedTuple

from ingero_mcp import units
from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.models import Accounting, CausalChain, ThreadAccount
from ingero_mcp.sanitize import quote


class Syncs(NamedTuple):
    """The pace thread's synchronising calls in the window (report.feeder_syncs_sql)."""

    calls: int
    ns: int
    median_ns: int


SYNC_WAIT_SHARE = 0.1  # the syncs' time under this share of the GPU's idle time: the host never waited for the GPU


def _gpu_waited(t: ThreadAccount, syncs: Syncs | None, gpu_util_mean: float) -> str | None:
    """Below a GPU-bound average, the thread's syncs (at least one a second) returned at once: each found the GPU done
    with all it had queued, so the GPU's idle time was spent waiting for the host, not the host for it. Said with the
    numbers; no part of the host's time is singled out by it. An idle server (input waited for most of its time) is
    said by its idle line instead."""
    busy_s = t.busy_ns / 1e9
    if syncs is None or not busy_s or t.idle_ns >= 0.5 * t.total.wall_ns or syncs.calls < busy_s:
        return None
    idle_gpu_s = (1.0 - gpu_util_mean / 100.0) * busy_s
    if syncs.ns / 1e9 > SYNC_WAIT_SHARE * idle_gpu_s:
        return None
    return (f"The GPU waited for the host, not the host for the GPU: {gpu_util_mean:.0f}% busy on average while the "
            f"job used it, and the feeding thread's {syncs.calls:,} synchronising calls returned at once (median "
            f"{units.ns(syncs.median_ns)}, {units.ns(syncs.ns)} in all, {100 * syncs.ns / t.busy_ns:.1f}% of its "
            "time): it found the GPU done with its work whenever it asked. The job is host-bound as it runs, and no "
            "part of the thread's time is singled out as the cause: the split above is where that time went while "
            "the GPU waited.")


def _split(t: ThreadAccount, acc: Accounting) -> str:
    a = t.total
    parts = [(acc.run_outside_label, a.run_outside_ns), ("on the CPU in CUDA calls", a.run_inside_ns),
             ("asleep in CUDA calls (waiting for the GPU)", a.sleep_inside_ns),
             ("sleeping outside CUDA calls", a.sleep_outside_ns), ("waiting for a CPU", a.cpu_wait_ns),
             ("off-CPU, split unknown", a.off_cpu_unknown_ns)]
    shown = [f"{100 * ns / a.wall_ns:.0f}% {label}" for label, ns in sorted(parts, key=lambda p: -p[1])
             if a.wall_ns and ns / a.wall_ns >= 0.005]
    return ", ".join(shown)


def work_calls(n: int, acc: Accounting) -> str:
    """A count of launches/copies, labelled as an estimate where launches were scaled for probe gaps."""
    if acc.estimated:
        return (f"~{n:,} launches/copies, estimated: launches seen scaled by the probes' coverage "
                f"{100 * (acc.launch_coverage or 0):.0f}%")
    return f"{n:,} launches/copies"


def progress_text(t: ThreadAccount, acc: Accounting, per_mark: int | None = None) -> str:
    """'1,288 iterations, one per cuStreamSynchronize': the progress in its unit; launches and copies (every row,
    a call made in both API layers twice) only where no call marks the iterations, labelled as that."""
    marker = next((m for m in acc.progress if m.pid == t.pid), None)
    done = [s.iterations for s in t.seconds if s.iterations is not None]
    if marker is None or not done:
        return work_calls(t.total.work_calls, acc) + "; no call recurs once per iteration: progress read in those"
    by = ""
    if marker.tid is not None and marker.tid != t.tid:  # the loop's marks made by another thread (a prefetcher's sync)
        other = next((x for x in acc.threads if x.pid == t.pid and x.tid == marker.tid), None)
        name = quote(other.comm, 64) if other is not None and other.comm else "thread"
        by = f" made by {name}[{t.pid}/{marker.tid}]"
    span = (f"; every launch recurs {per_mark} times between two of them: {per_mark} steps of the loop each, or a "
            f"step that repeats its work {per_mark} times"
            if per_mark else "")
    return f"{sum(done):,.0f} iterations, one per {marker.label}{by}{span}"


GPU_BOUND_MEAN = 80  # %: the GPU's mean utilisation from which a run with nothing found is said to be GPU-bound


def verdict(acc: Accounting | None, chains: list[CausalChain], gpu_util_mean: float | None,
            syncs: Syncs | None = None, per_mark: dict[int, int] | None = None,
            autotuning: str | None = None) -> list[str]:
    """Who fed the GPU and where its time went, then the causes that explain the lost time (or why none); `syncs`:
    the pace thread's synchronising calls, which say whether the GPU waited for the host; `per_mark`: per process,
    how many times every kernel recurs between two marks of its iterations, where that is two or more; `autotuning`:
    the share of the lead process's samples in cuDNN's autotuning, where a busy GPU would be said to set the pace."""
    lines: list[str] = []
    if acc is not None and acc.imported is not None:  # an import: its own accounting leads, then what it could not do
        from ingero_mcp.analysis.imported_verdict import verdict_lines

        return verdict_lines(acc.imported, chains)
    if acc is None or not acc.complete:
        lines.append(f"No time accounting: {acc.note if acc else 'not computed'}.")
    else:
        from ingero_mcp.analysis.causes import pace_threads

        feeders = pace_threads(acc)
        seen: set[int] = set()
        for t in feeders:
            if t.pid in seen:
                continue
            seen.add(t.pid)
            thread = "main thread" if t.tid == t.pid else f"thread {quote(t.comm or '?', 64)}[{t.tid}]"
            idle = (f" Of that, {t.idle_ns / 1e9:,.1f} s was idle: waiting for input (woken by an interrupt) "
                    "with nothing queued on the GPU, not lost feeding time."
                    if t.idle_ns >= 0.01 * t.total.wall_ns else "")
            # the line starts with a fixed word, the name quoted: a process may name itself "SYSTEM: ..."
            lines.append(f"process {quote(t.process_comm or t.comm or '?', 64)}[{t.pid}]'s {thread} fed the GPU "
                         f"({progress_text(t, acc, (per_mark or {}).get(t.pid))}), {t.total.wall_ns / 1e9:,.1f} s: "
                         f"{_split(t, acc)}.{idle}")
            if len(seen) >= 2:
                break
        if not feeders:
            lines.append("No thread started CUDA work in this window.")
    own = [c for c in chains if c.origin == "ingero-mcp" and c.severity in ("HIGH", "MEDIUM")]
    for c in own[:3]:
        lost = f" [{c.seconds_lost:.1f} s explained]" if c.seconds_lost is not None else ""
        lines.append(f"{c.severity}: {c.summary}{lost}")
    gpu_bound = [c for c in chains if c.origin == "ingero-mcp" and c.root_cause == rc.GPU_BOUND]
    low = [c for c in chains if c.origin == "ingero-mcp" and c.root_cause != rc.GPU_BOUND]
    host_s, gpu_s = (sum(c.seconds_lost or 0.0 for c in cs) for cs in (low, gpu_bound))
    if not own and gpu_bound and host_s > gpu_s:  # the GPU's own slow stretches explain less than the host's small ones
        lines.append(f"No cause asserted: {len(low)} LOW finding{'s' if len(low) != 1 else ''} on the host side "
                     f"({host_s:.1f} s together) and {len(gpu_bound)} slow "
                     f"stretch{'es' if len(gpu_bound) != 1 else ''} whose pace the GPU's own work set ({gpu_s:.1f} s): "
                     "the findings below.")
    elif not own and gpu_bound:  # a slow phase that was the GPU's own: said, as no host-side cause
        lines.append(f"No host-side cause: {gpu_bound[0].summary}.")
    elif not own and acc is not None and acc.complete and acc.threads:
        from ingero_mcp.analysis.causes import pace_threads
        from ingero_mcp.analysis.causes.context import IDLE_GPU, STEADY_MIN_SHARE
        from ingero_mcp.analysis.causes.narration import DRAINED

        feeding_s = sum(t.busy_ns for t in pace_threads(acc)[:1]) / 1e9
        # the steady state's findings in drained gaps: the feeding thread left the GPU nothing queued after its syncs
        drained = [c for c in low if DRAINED in c.summary and not c.summary.startswith("during start-up")]
        drained_s = sum(c.seconds_lost or 0.0 for c in drained)
        left = bool(feeding_s) and drained_s >= STEADY_MIN_SHARE * feeding_s
        waited = (_gpu_waited(pace_threads(acc)[0], syncs, gpu_util_mean)
                  if gpu_util_mean is not None and gpu_util_mean < 80 and pace_threads(acc) else None)
        if waited:
            lines.append(waited)
        elif gpu_util_mean is not None and gpu_util_mean >= GPU_BOUND_MEAN and left:
            n = len(drained)
            lines.append(f"No host-side cause asserted: the GPU was {gpu_util_mean:.0f}% busy on average while the job "
                         f"used it, but its feeding thread left it nothing queued for at least {drained_s:.1f} s "
                         f"({100 * drained_s / feeding_s:.0f}% of the feeding time) after its syncs: the LOW "
                         f"finding{'s' if n != 1 else ''} below, said, not asserted.")
        elif gpu_util_mean is not None and gpu_util_mean >= GPU_BOUND_MEAN and autotuning:
            lines.append(f"No host-side cause asserted: the GPU was {gpu_util_mean:.0f}% busy on average while the job "
                         f"used it, but {autotuning} were in cuDNN's autotuning, timing each convolution's candidate "
                         "kernels on the GPU at input shapes not seen before (torch.backends.cudnn.benchmark): its "
                         "work was in part those trials. Where shapes vary, turn it off, or give the model a few fixed "
                         "shapes so that each is tuned once.")
        elif gpu_util_mean is not None and gpu_util_mean >= GPU_BOUND_MEAN:
            lines.append(f"No host-side cause: the GPU was {gpu_util_mean:.0f}% busy on average while the job used it, "
                         "the job is GPU-bound.")
        elif gpu_util_mean is not None and gpu_util_mean >= IDLE_GPU:
            lines.append(_not_weighed(gpu_util_mean))
        else:
            util = (f"GPU {gpu_util_mean:.0f}% busy on average while the job used it" if gpu_util_mean is not None
                    else "GPU utilisation not recorded")
            lines.append(f"No host-side cause explains more than 5% of the feeding time ({util}): nothing slowed the "
                         "feeding threads beyond their steady state.")
    return lines


def _not_weighed(gpu_util_mean: float) -> str:
    """No cause asserted with the GPU busy between IDLE_GPU and GPU-bound. There a part of the host's time counts
    only where the feeding thread had left the GPU with nothing queued (drained gaps), said as LOW at most; its idle
    time while work was queued (gaps between kernels, launches slower than the kernels) is not split between the
    host and the GPU, so not ruled out."""
    from ingero_mcp.analysis.causes.context import IDLE_GPU

    return (f"No host-side cause asserted (GPU {gpu_util_mean:.0f}% busy on average while the job used it): in the "
            f"seconds it was over {IDLE_GPU:.0f}% busy, host-side time counts only where nothing was queued on it "
            "(after a sync, before the next launch), said as LOW findings where it adds up; its idle time while work "
            "was queued (gaps between kernels, launches slower than the kernels) is not split between host and GPU "
            "here, so a launch-bound loop is not ruled out.")
