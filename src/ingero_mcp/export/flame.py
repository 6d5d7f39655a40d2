"""A finding's flame graph for the HTML report (issue 21): inline SVG, no script, drawn from the heaviest folded stacks
the finding carries. Outermost frame on top (an icicle), each frame as wide as its share of the profile's time; the
stacks left out leave their share blank at the right, labelled. Frames are traced text: cleaned and escaped.
"""

from __future__ import annotations

import html

from ingero_mcp.analysis import FindingFrames, StackProfile
from ingero_mcp.sanitize import clean

WIDTH, ROW = 1000, 17  # the SVG's user units: the width, one frame's height
CHAR_W = 6.6  # a label's character at the font size used, to fit labels in their box
USER, PY, KERNEL, LEAF = "#8fb4d9", "#a6d49f", "#f2a477", "#4e79a7"


def _esc(text: object, cap: int = 400) -> str:
    return html.escape(clean("" if text is None else str(text), cap))


def _tree(p: StackProfile) -> dict:
    """The folded stacks as a tree: name -> [seconds, kind, children]."""
    root: dict = {}
    for s in p.stacks:
        level = root
        names = s.folded.split(";")
        for i, name in enumerate(names):
            kind = "kernel" if s.kernel_from is not None and i >= s.kernel_from else "leaf" if i == s.leaf else "user"
            node = level.setdefault(name, [0.0, kind, {}])
            node[0] += s.seconds
            if kind == "leaf":
                node[1] = "leaf"
            level = node[2]
    return root


def _depth(level: dict) -> int:
    return 1 + max((_depth(n[2]) for n in level.values()), default=0) if level else 0


def profile_svg(p: StackProfile, title: str) -> str:
    """One profile's flame graph as an <svg> element (empty string: no stacks)."""
    if not p.stacks or not p.seconds:
        return ""
    tree = _tree(p)
    rows = _depth(tree)
    height = (rows + 1) * ROW
    out: list[str] = []

    def draw(level: dict, x0: float, depth: int) -> None:
        x = x0
        for name, (secs, kind, kids) in sorted(level.items(), key=lambda kv: -kv[1][0]):
            w = WIDTH * secs / p.seconds
            share = 100 * secs / p.seconds
            color = {"kernel": KERNEL, "leaf": LEAF}.get(kind, USER)
            fill = ' fill="#fff"' if kind == "leaf" else ""
            label = _esc(name)
            room = int(w / CHAR_W) - 1
            text = label if len(clean(name, 400)) <= room else (_esc(clean(name, 400)[:room - 1]) + "…"
                                                                 if room > 3 else "")
            note = {"kernel": ", in the kernel", "leaf": ", the frame of interest"}.get(kind, "")
            out.append(f'<g class="frame" data-share="{share:.1f}"><title>{label} ({share:.1f}%, {secs:.3f} s{note}'
                       f')</title><rect x="{x:.2f}" y="{(depth + 1) * ROW}" width="{max(w - 0.5, 0.5):.2f}" '
                       f'height="{ROW - 1}" fill="{color}"/>'
                       + (f'<text x="{x + 3:.2f}" y="{(depth + 2) * ROW - 5}"{fill}>{text}</text>' if text else "")
                       + "</g>")
            draw(kids, x, depth + 1)
            x += w

    draw(tree, 0.0, 0)
    shown = sum(s.seconds for s in p.stacks)
    rest = max(0.0, 1 - shown / p.seconds)
    what = "on-CPU samples (an estimate)" if p.mode == "on_cpu" else "sleep time at switch-outs"
    head = (f"{_esc(title)}: {p.count:,} {'samples' if p.mode == 'on_cpu' else 'sleeps'}, {p.seconds:.2f} s of "
            f"{what}" + (f"; {100 * rest:.0f}% in stacks not drawn" if rest >= 0.005 else ""))
    return (f'<svg class="flame" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
            f'width="100%" role="img" aria-label="flame graph" font-family="monospace" font-size="11">'
            f'<text x="0" y="{ROW - 5}" font-weight="bold">{head}</text>{"".join(out)}</svg>')


def flame_html(frames: FindingFrames | None) -> str:
    """A finding's flame graphs (its thread's, then each traced culprit's), with its sentence; '' without frames."""
    if frames is None:
        return ""
    parts = [profile_svg(frames.profile, "its code" if frames.part != "cpu_wait" else "the culprit's code")]
    parts += [profile_svg(c, f"culprit pid {c.pid}" + (f"/{c.tid}" if c.tid is not None else "")
                          + (f" threads {', '.join(map(str, c.tids))}" if c.tids else "")) for c in frames.culprits]
    graphs = "".join(p for p in parts if p)
    sentence = f"<p><b>Code:</b> {_esc(frames.sentence, 2000)}</p>" if frames.sentence else ""
    return f'<div class="code">{sentence}{graphs}</div>' if sentence or graphs else ""
