"""A library's autotuning, read from a process's on-CPU samples: a slow phase at a busy GPU whose threads were timing
candidate kernels (cuDNN's benchmark mode at input shapes it has not seen). The GPU set the pace, but with work the
program asked for on top of its steps: the GPU's work per step grew, and the program's settings say why."""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.causes.context import Ctx, Finding
from ingero_mcp.analysis.causes.culprits import HOST_WORK_SAMPLES, Explained
from ingero_mcp.analysis.models import Evidence, TimeWindow
from ingero_mcp.analysis.stacks import autotuning_share_sql, recorded

AUTOTUNE_SHARE = 50  # % of the process's on-CPU samples in the window in autotuning that say the phase was that


def autotuning_share(con: duckdb.DuckDBPyConnection, pid: int, window: TimeWindow) -> float | None:
    """The share (%) of the process's on-CPU samples in the window (all its threads) in autotuning, where there were
    HOST_WORK_SAMPLES and AUTOTUNE_SHARE of them were in it; None otherwise (a store without stacks included)."""
    if not recorded(con):
        return None
    pct, samples = shared_rows(con, autotuning_share_sql(pid, window))[0]
    if pct is None or int(samples or 0) < HOST_WORK_SAMPLES or float(pct) < AUTOTUNE_SHARE:
        return None
    return float(pct)


def autotuning(ctx: Ctx, f: Finding, before: str) -> Explained | None:
    """GPU_SLOWER, said as the autotuning, where AUTOTUNE_SHARE of the process's on-CPU samples in the finding's window
    (HOST_WORK_SAMPLES at least) were in it; None otherwise. `before`: the baseline's GPU utilisation, said."""
    pid = f.thread.pid
    sql = autotuning_share_sql(pid, f.window)
    pct, samples = shared_rows(ctx.con, sql)[0]
    if pct is None or int(samples or 0) < HOST_WORK_SAMPLES or float(pct) < AUTOTUNE_SHARE:
        return None
    who = f"{f.thread.process_comm or f.thread.comm or '?'}[{pid}]"
    share = f"{float(pct):.0f}% of {who}'s on-CPU samples (all its threads)"
    gpu = f"{f.gpu_util:.0f}" if f.gpu_util is not None else "?"
    return Explained(
        cause=rc.GPU_SLOWER, numbers={"autotuning": share, "gpu": gpu},
        evidence=[Evidence(name=f"{who}'s on-CPU samples in the window (all its threads) with a frame in cuDNN's "
                                f"autotuning (time_sorted_plan, get_plans_from_find, cudnnFind*), of "
                                f"{int(samples or 0)}", value=float(pct), unit="%", sql=sql)],
        reason=(f"the GPU was {gpu}% busy in it{before}, no other process seen using it, and {share} were in cuDNN's "
                "autotuning (timing each convolution's candidate kernels on the GPU, a synchronisation each): the "
                "GPU's work per step grew by those trials, which cuDNN's benchmark mode runs at every input shape it "
                "has not seen"))
