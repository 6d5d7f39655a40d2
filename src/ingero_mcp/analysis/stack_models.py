"""The models of stacks (issue 21, "name the code"): frames, folded stacks and a thread's profile over a window, on
its own module so that models.py stays under the house's size; the facade serves them like the other models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Frame(BaseModel):
    """One frame of a stack: the function, and where known its module, source file and line."""

    function: str
    module: str | None = None
    file: str | None = None
    line: int | None = None
    python: bool = Field(False, description="a Python function (merged in from the interpreter's frames)")

    def label(self) -> str:
        """'default_collate (torch/utils/data/_utils/collate.py:123)', 'memcpy [libc.so.6]' or the function."""
        if self.file:
            return f"{self.function} ({self.file}{'' if self.line is None else f':{self.line}'})"
        return f"{self.function} [{self.module}]" if self.module else self.function


class FrameShare(BaseModel):
    """A frame's weight in a profile: self (it was the frame of interest, the innermost one past the runtime's
    noise) and inclusive (anywhere on the stack), in seconds and as shares of the profile's total."""

    frame: Frame
    self_s: float
    self_share: float
    inclusive_s: float
    inclusive_share: float
    caller: Frame | None = Field(None, description="where it was most often called from (the next frame outward)")


class FoldedStack(BaseModel):
    """One distinct stack, outermost first, with its weight (the folded-stack format of flame graphs)."""

    folded: str = Field(description="frames outermost first, joined by ';' (user frames, then kernel frames)")
    frames: list[Frame] = Field([], description="outermost first: the user (or Python) frames, then the kernel's "
                                                "(empty in a finding's frames, to keep chains small: folded has them)")
    kernel_from: int | None = Field(None, description="index in frames where the kernel's frames begin")
    leaf: int | None = Field(None, description="index in frames of the frame of interest")
    seconds: float
    share: float
    count: int = Field(description="samples (on-CPU) or off-CPU intervals")


class StackProfile(BaseModel):
    """Where a thread (or a process) ran or blocked in a window, from stacks.

    on_cpu: from on-CPU samples, each 1/sample_hz s (an estimate from `count` samples); off_cpu: from the stacks
    taken as it went to sleep, each interval weighted by its sleep time. `why_none` says in words why there are no
    stacks where there are none; a frame is never invented."""

    mode: Literal["on_cpu", "off_cpu"]
    pid: int
    tid: int | None = None
    tids: list[int] = Field([], description="a group of the process's threads (a pool named as a culprit)")
    io: bool = Field(False, description="off_cpu: only its uninterruptible (IO) sleeps")
    start_ns: int
    end_ns: int
    seconds: float = Field(0.0, description="time the stacks stand for (on-CPU: samples / sample_hz, an estimate)")
    count: int = Field(0, description="samples (on-CPU) or intervals with a stack (off-CPU)")
    sample_hz: int | None = None
    estimate: bool = False
    covered_of_s: float | None = Field(None, description="the thread's on-CPU (off-CPU: sleep) time in the window, "
                                                          "from the accounting (None: not known)")
    coverage: float | None = Field(None, description="seconds / covered_of_s, at most 1 (samples estimate the time; "
                                                      "None: not known)")
    top_frames: list[FrameShare] = []
    kernel_frames: list[FrameShare] = Field([], description="off-CPU: the kernel functions it slept in")
    stacks: list[FoldedStack] = []
    stacks_total: int = Field(0, description="distinct stacks in the window (stacks lists the heaviest)")
    why_none: str | None = None
    sql: str = Field("", description="SQL giving the weight per distinct stack (count, ns)")


class FindingFrames(BaseModel):
    """The code behind a finding: the feeding thread's frames in the part of its time the finding is about, and
    the frames of culprits that are traced threads (what the GIL holder or hog ran)."""

    part: str
    profile: StackProfile
    culprits: list[StackProfile] = []
    sentence: str = Field("", description="the finding's top frames in words (also in the chain's evidence)")


class StacksResult(BaseModel):
    """get_stacks: a thread's (or process's) on-CPU and off-CPU profiles over a window, and how stacks were taken."""

    pid: int
    tid: int | None = None
    start_ns: int
    end_ns: int
    on_cpu: StackProfile | None = None
    off_cpu: StackProfile | None = None
    sources: list[str] = Field([], description="how this process's stacks were taken, in words")
