"""A DataLoader's sampler, read from a thread's on-CPU samples: where its data loading was drawing the batches'
indices, which runs in the main process on the thread that iterates the loader, whatever num_workers, so the
loading fix (more workers) does not reach it."""

from __future__ import annotations

from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.causes.context import Ctx
from ingero_mcp.analysis.models import Evidence, TimeWindow
from ingero_mcp.analysis.stacks import sampling_share_sql

SAMPLER_SHARE = 50  # % of the thread's on-CPU samples in a DataLoader's sampler that say its loading was the sampler


def sampler_work(ctx: Ctx, pid: int, tid: int, window: TimeWindow, whose: str, calls: str | None = None,
                 within: tuple[str, str] | None = None) -> tuple[str, dict[str, object], Evidence] | None:
    """culprits.host_work's answer where the thread's data loading was mostly its sampler: the words, the number its
    fix cites (`sampling`) and the evidence whose SQL recomputes it; None where the sampler held under SAMPLER_SHARE."""
    sql = sampling_share_sql(pid, tid, window, calls, within[0] if within else None)
    pct, samples = shared_rows(ctx.con, sql)[0]
    if pct is None or float(pct) < SAMPLER_SHARE:
        return None
    counted = f"{whose} on-CPU samples{f' {calls} CUDA calls' if calls else ''}{f' {within[1]}' if within else ''}"
    share = f"{float(pct):.0f}% of {counted}"
    return (f"{share} in a DataLoader's sampler, drawing the batches' indices (it runs in the main process, on the "
            "thread that iterates the loader, whatever num_workers)",
            {"sampling": f"{share} in a DataLoader's sampler"},
            Evidence(name=f"{counted} with a frame in a DataLoader's sampler (its iterator's _next_index, "
                          f"torch/utils/data/sampler.py), of {int(samples or 0)}", value=float(pct), unit="%",
                     sql=sql))
