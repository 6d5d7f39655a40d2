"""A finding's code (issue 21) as terminal text: its sentence on the default page, and on `--full` the top frames
(self and inclusive shares) and heaviest stacks of the thread and of its traced culprits. Frames are traced text:
cleaned, and never the start of a line (the callers' wrap puts the renderer's words first).
"""

from __future__ import annotations

from ingero_mcp.analysis import FindingFrames, StackProfile
from ingero_mcp.render import fmt
from ingero_mcp.render.wrap import wrap

FRAMES_SHOWN, STACKS_SHOWN = 5, 3
STACK_CAP = 300  # characters of one folded stack on the terminal (the MCP tool and the report keep it whole)


def code_sentence(frames: FindingFrames | None) -> str | None:
    """The finding's top frames in one sentence, cleaned (None: the store has no stacks for it)."""
    if frames is None or not frames.sentence:
        return None
    return fmt.clean(frames.sentence, 2000)


def who(p: StackProfile) -> str:
    """'pid 700, thread 701' (the renderer's words: numbers only)."""
    if p.tids:
        return f"pid {p.pid}, threads {', '.join(map(str, p.tids))}"
    return f"pid {p.pid}" + (f", thread {p.tid}" if p.tid is not None else "")


def profile_lines(p: StackProfile, title: str) -> list[tuple[str, str]]:
    """A profile as (the renderer's words, traced text) pairs: its total, coverage, top frames and heaviest folded
    stacks (or why there are none)."""
    kind = "on-CPU samples" if p.mode == "on_cpu" else "sleeps with a stack"
    if p.why_none or not p.top_frames:
        return [(f"{title}: no {kind}: ", fmt.clean(p.why_none or "none in this window", 600))]
    est = f" (an estimate at {p.sample_hz or '?'} Hz)" if p.estimate else ""
    cov = f", {100 * p.coverage:.0f}% of the accounting's time" if p.coverage is not None else ""
    out = [(f"{title}: {p.count:,} {kind}, {p.seconds:,.2f} s{est}{cov}", "")]
    for fs in p.top_frames[:FRAMES_SHOWN]:
        called = f" <- {fmt.clean(fs.caller.label(), 200)}" if fs.caller else ""
        out.append((f"  self {100 * fs.self_share:3.0f}%  incl {100 * fs.inclusive_share:3.0f}%  ",
                    f"{fmt.clean(fs.frame.label(), 300)}{called}"))
    for fs in p.kernel_frames[:2]:
        out.append((f"  kernel {100 * fs.self_share:3.0f}%  ", fmt.clean(fs.frame.label(), 300)))
    for s in p.stacks[:STACKS_SHOWN]:
        out.append((f"  stack {100 * s.share:3.0f}%  ", fmt.clean(s.folded.replace(";", "; "), STACK_CAP)))
    return out


def frames_lines(frames: FindingFrames | None, width: int = 100, names: list[str] | None = None) -> list[str]:
    """Every line of a finding's code for `--full` at `width`: the thread's profile, then each traced culprit's;
    each line starts with the renderer's words or indent, never with a frame."""
    if frames is None:
        return []
    title = "code" if frames.part != "cpu_wait" else "culprit's code"
    # analysis/causes/frames.py: a profile of the samples outside (inside) the thread's CUDA calls
    where = {"run_outside": ", outside its CUDA calls", "sleep_outside": ", outside its CUDA calls",
             "run_inside": ", inside its CUDA calls", "gpu_wait": ", inside its CUDA calls"}.get(frames.part, "")
    pairs = profile_lines(frames.profile, f"{title} ({who(frames.profile)}{where})")
    for p in frames.culprits:
        pairs += profile_lines(p, f"culprit's code ({who(p)})")
    out = []
    for words, traced in pairs:
        out += wrap(traced, width, words, " " * 14, names or []) if traced else [words]
    return out
