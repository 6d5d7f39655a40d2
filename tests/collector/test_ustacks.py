"""User stacks' userspace half (collector/ustacks.py) on given addresses: the Python merge, the end of a walk that
left the frame chain, the frame-pointer verdict and the stable ids. The eBPF half runs for real in test_stacks.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from ingero_mcp.collector.kstacks import stack_id
from ingero_mcp.collector.ustacks import NO_FRAME_POINTERS, UserStacks, is_interpreter

SYMBOLS = {  # address -> (function, module)
    0x10: ("matmul_kernel_cpu", "libtorch_cpu.so"), 0x20: ("at_native_mm", "libtorch_cpu.so"),
    0x30: ("_PyEval_EvalFrameDefault", "libpython3.12.so.1.0"), 0x40: ("PyObject_Call", "libpython3.12.so.1.0"),
    0x50: ("main", "python3.12"), 0x60: ("fsync", "libc.so.6"), 0x70: ("0x70", None),
}


class StackMap:
    """The stack map's lookups as BCC's table answers them: Key(id), then [key].ip (0-terminated)."""

    def __init__(self, stacks: dict[int, list[int]]) -> None:
        self.stacks = stacks

    def Key(self, map_id: int) -> int:
        return map_id

    def __getitem__(self, map_id: int) -> Any:
        return SimpleNamespace(ip=[*self.stacks[map_id], 0])


class Walker:
    """The Python walker's two answers for pid 7 (py id 99), nothing for others."""

    def add_process(self, pid: int) -> tuple[str | None, bool, str | None]:
        return ("3.12", True, None) if pid == 7 else (None, False, "not CPython")

    def frames(self, pid: int, py_id: int) -> list[tuple[str, str | None, int | None]] | None:
        return [("forward", "/m/model.py", 41), ("train_step", "/m/train.py", 10)] if (pid, py_id) == (7, 99) else None


def _stacks() -> UserStacks:
    table = StackMap({1: [0x10, 0x20, 0x30, 0x40, 0x50], 2: [0x60, 0x70, 0x50], 3: [0x60, 0x20, 0x50]})
    return UserStacks(table, lambda _pid, addr: SYMBOLS[addr], Walker(), 49)


def test_python_stack_keeps_native_frames_up_to_the_interpreter_then_python_frames() -> None:
    us = _stacks()
    us.add_process(7)
    ids = us.column(np.array([7, 7, 8]), np.array([1, 1, 1]), np.array([99, 99, 0], np.uint64)).to_pylist()
    assert ids[0] == ids[1] != ids[2]
    rows = {r["stack_id"]: r for r in us.take_rows().to_pylist()}
    py, native = rows[ids[0]], rows[ids[2]]
    assert py["kind"] == "python" and py["frames"] == ["matmul_kernel_cpu", "at_native_mm", "forward", "train_step"]
    assert py["modules"] == ["libtorch_cpu.so", "libtorch_cpu.so", None, None]
    assert py["files"] == [None, None, "/m/model.py", "/m/train.py"] and py["lines"] == [None, None, 41, 10]
    assert native["kind"] == "user" and native["files"] is None and native["lines"] is None
    assert native["frames"][2:] == ["_PyEval_EvalFrameDefault", "PyObject_Call", "main"]
    assert native["stack_id"] == stack_id(native["frames"], native["modules"])
    assert us.take_rows() is None  # each stack once


def test_walk_ends_at_an_address_in_no_file_and_frame_pointers_follow_depth() -> None:
    us = _stacks()
    for pid in (7, 8):
        us.add_process(pid)
    (bad,) = us.column(np.array([8]), np.array([2]), np.array([0], np.uint64)).to_pylist()
    (good,) = us.column(np.array([7]), np.array([3]), np.array([0], np.uint64)).to_pylist()
    rows = {r["stack_id"]: r for r in us.take_rows().to_pylist()}
    assert rows[bad]["frames"] == ["fsync"] and rows[good]["frames"] == ["fsync", "at_native_mm", "main"]
    # not taken (-EFAULT), and taken but gone from the map: NULL beside a known one; unreadable counted
    got = us.column(np.array([8, 8, 7]), np.array([-14, 5, 3]), np.zeros(3, np.uint64)).to_pylist()
    assert got == [None, None, good] and us.unreadable == 1
    sources = {r["pid"]: r for r in us.sources_table().to_pylist()}
    assert sources[7] == {"pid": 7, "python": "3.12", "python_frames": True, "frame_pointers": True,
                          "sample_hz": 49, "note": None}
    assert sources[8]["frame_pointers"] is False and sources[8]["note"] == f"not CPython; {NO_FRAME_POINTERS}"


def test_interpreter_frames() -> None:
    assert is_interpreter("_PyEval_EvalFrameDefault", None) and is_interpreter("x", "libpython3.12.so.1.0")
    assert is_interpreter("x", "python3.12") and not is_interpreter("x", "libtorch_python.so")
