"""A lock of the program's own, read from the stacks of the threads that slept on it: where it is taken (the Python
function most of their sleep waited in, outside the GIL's waits and the standard library's waits for a signal), and
the thread that held it over its work (the one waker of a thread's futex sleeps, running while it slept)."""

from __future__ import annotations

from dataclasses import replace

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis._sql import rows
from ingero_mcp.analysis.causes.context import Ctx, Finding
from ingero_mcp.analysis.causes.culprits import Explained
from ingero_mcp.analysis.models import Evidence, TimeWindow
from ingero_mcp.analysis.stack_models import Frame
from ingero_mcp.analysis.stacks import lock_waits_sql, recorded
from ingero_mcp.analysis.waits import WaitPath


def own_lock(ctx: Ctx, pid: int, tids: list[int], w: TimeWindow,
             whose: str = "the pool's") -> tuple[str, Evidence] | None:
    """Where threads slept, by their stacks: half of it or more in one Python function, outside the GIL's waits (under
    a fifth of it) and the standard library's waits for a signal: a lock of the program's own taken there (the
    function's label), with its evidence; else None (no stacks, the GIL, or it cannot tell)."""
    sql = lock_waits_sql(pid, tids, w)
    got = rows(ctx.con, sql) if recorded(ctx.con) else []
    if not got or float(got[0][0] or 0) < 50 or float(got[0][4] or 0) >= 20:
        return None
    return Frame(function=got[0][1], file=got[0][2], line=got[0][3]).label(), Evidence(
        name=f"{whose} stacked sleep in one Python function, outside the GIL's and the standard library's waits "
             "(share; then the function, file, line, the GIL's share, the signal waits' share)",
        value=float(got[0][0]), unit="%", sql=sql)


def held_lock(ctx: Ctx, f: Finding, path: WaitPath, ex: Explained, kind: str, pooled: str | None) -> Explained:
    """ex, or LOCK_OR_GIL where the thread's futex sleep was ended by one thread of its process, running while it
    waited (ex: WAITING_ON_THREAD, straight from that waker), and the thread's own stacked sleep waited in a lock of
    the program's own (own_lock): the waker held that lock over its work, which the thread did not wait for
    (natural_registry_lock_export: a metrics exporter gzipping the registry under the lock each step's record()
    takes, said as 'its work' with the fix to make that work smaller)."""
    if kind != "futex" or ex.cause != rc.WAITING_ON_THREAD or pooled or path.end is not path.hops[0]:
        return ex
    t, end = f.thread, path.end
    own = own_lock(ctx, t.pid, [t.tid], f.window, "the thread's")
    if own is None:
        return ex
    return replace(ex, cause=rc.LOCK_OR_GIL, evidence=[*ex.evidence, own[1]],
                   numbers={**ex.numbers, "lock_own": own[0], "lock_held": "running"},
                   reason=f"{ex.reason}; it slept on a lock of the program's own (taken in {own[0]}), which "
                          f"{ctx.who(end.pid, end.tid)} held over that work")
