"""STUB until the Python walker (wt-pyframes) lands: no process is walked, no Python frame is known.

The real module fills collectors/pyframes.bpf.h's config map per CPython process and turns the ids py_stack()
stored into (function, file, line) frames, innermost first. The collector calls it through these three methods.
"""

from __future__ import annotations

from typing import Any

PyFrame = tuple[str, str | None, int | None]  # (function, source file, line)


class PythonFrames:
    """The Python walker's userspace side (stub: walks nothing)."""

    def __init__(self, bpf: Any) -> None:
        self.bpf = bpf

    def add_process(self, pid: int) -> tuple[str | None, bool, str | None]:
        """Prepare walking `pid`: (Python version or None, frames walkable, note)."""
        return None, False, "Python frames not walked: this build has no Python walker"

    def frames(self, pid: int, py_id: int) -> list[PyFrame] | None:
        """The Python frames of the stack `py_id` of `pid` (innermost first); None: unknown."""
        return None
