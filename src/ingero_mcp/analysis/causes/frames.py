"""The code behind a finding (issue 21): the feeding thread's top frames in the part of its time the finding is
about (on-CPU parts from samples, sleeps from the stacks taken as it went to sleep) and what its culprits ran where
they are traced threads, attached to the chain with a sentence in its evidence whose share its SQL recomputes.
"""

from __future__ import annotations

from ingero_mcp.analysis._sql import rows
from ingero_mcp.analysis.causes.context import Ctx, Finding
from ingero_mcp.analysis.models import CausalChain, Evidence, TimeWindow
from ingero_mcp.analysis.stack_models import FindingFrames, StackProfile
from ingero_mcp.analysis.stacks import profile, self_share_sql, sentence

# The part of the accounting -> the stacks that show it.
PART_MODE = {"run_outside": "on_cpu", "run_inside": "on_cpu", "sleep_outside": "off_cpu", "io": "off_cpu",
             "gpu_wait": "off_cpu", "cpu_wait": "on_cpu"}
TOP, TOP_STACKS, CULPRITS = 5, 5, 2
# A culprit's on-CPU samples below this many name no code: 3 samples at 49 Hz cannot tell what it ran (on the H200's
# seed benchmark a worker's feeder thread had 3, "an estimate of 0.06 s", 356% of its on-CPU time).
MIN_CULPRIT_SAMPLES = 10


def attach_frames(ctx: Ctx, f: Finding, chain: CausalChain) -> None:
    """Give the chain its finding's frames and the sentence naming them (the store has stacks: `stacks.recorded`)."""
    mode = PART_MODE.get(f.part)
    if mode is None or not f.window:
        return
    t = f.thread
    own = None
    # its running (sleep) outside or inside CUDA calls: the samples taken (the sleeps begun) there only
    calls = {"run_outside": "outside", "sleep_outside": "outside", "run_inside": "inside", "gpu_wait": "inside"}.get(
        f.part)
    if f.part != "cpu_wait":  # waiting for a CPU, the thread ran nothing: its culprits' frames are the point
        own = profile(ctx.con, mode, t.pid, t.tid, f.window, ctx.t0, top=TOP, top_stacks=TOP_STACKS,
                      io=f.part == "io", calls=calls)  # an IO finding: its IO sleeps only
    traced = {tid for _p, tid in ctx.traced_threads()}
    culprits = []
    for c in chain.culprits:
        tids = sorted(set(c.tids) & traced - {t.tid})  # the culprit's traced threads (the thread itself aside)
        if len(culprits) >= CULPRITS or c.pid is None or not tids:
            continue
        p = profile(ctx.con, "on_cpu", c.pid, tids[0] if len(tids) == 1 else tids, f.window, ctx.t0, top=TOP,
                    top_stacks=TOP_STACKS)
        if p.top_frames and p.count >= MIN_CULPRIT_SAMPLES:
            culprits.append(p)
    if own is None and not culprits:
        return
    for p in ([own] if own else []) + culprits:
        for s in p.stacks:
            s.frames = []  # a finding carries its stacks folded (get_stacks gives each frame's file and line)
    words = []
    if own is not None:
        # named, not 'its': the line follows the culprits' in the report, and 'its' read as theirs
        words.append(_said(ctx, chain, own, f"{ctx.who(t.pid, t.tid)}'s", calls))
    for p in culprits:
        group = f"{ctx.who(p.pid, p.tids[0])} and {len(p.tids) - 1} more of its threads'" if p.tids else ""
        words.append(_said(ctx, chain, p, group or f"{ctx.who(p.pid, p.tid)}'s"))
    chain.frames = FindingFrames(part=f.part, profile=own or culprits[0], culprits=culprits if own else culprits[1:],
                                 sentence="; ".join(words))


def _said(ctx: Ctx, chain: CausalChain, p: StackProfile, who: str, calls: str | None = None) -> str:
    """The profile's sentence, and the evidence whose SQL recomputes its top frame's share (`calls`: a profile of
    the samples outside / inside the thread's CUDA calls)."""
    if not p.top_frames:
        text = sentence(p, who, calls)
        chain.evidence.append(Evidence(name=f"{who} code in this window ({p.mode.replace('_', '-')})", value=text,
                                       sql=f"SELECT count(*), sum(n) FROM ({p.sql})"))
        return text
    top = p.top_frames[0]
    sql = self_share_sql(p.mode, p.pid, p.tids or p.tid, _window(p), top.frame, kernel=False, t0=ctx.t0, io=p.io,
                         calls=calls)
    share, count, seconds, covered = rows(ctx.con, sql)[0]
    # the numbers the sentence shows are the ones its SQL gives (a share of samples, not of their ns)
    top.self_share = round(float(share or 0) / 100, 4)
    p.count, p.seconds = int(count or 0), float(seconds or 0)
    p.coverage = None if covered is None else float(covered) / 100
    text = sentence(p, who, calls)
    what = ("on-CPU samples" if p.mode == "on_cpu" else "sleep time") + (f" {calls} CUDA calls" if calls else "") + (
        "" if p.mode == "on_cpu" else " with a stack")
    chain.evidence.append(Evidence(name=f"{who} code: {text} (share of {what} whose frame of interest is "
                                        f"{top.frame.label()}; the count, seconds and share of the accounting's time "
                                        "covered in the SQL's other columns)",
                                   value=float(share or 0), unit="%", sql=sql))
    return text


def _window(p: StackProfile) -> TimeWindow:
    return TimeWindow(start_ns=p.start_ns, end_ns=p.end_ns)
