"""Python frames from CPython's own state: the ELF lookup (pure) and the eBPF walk on real interpreters.

The eBPF tests load collectors/pyframes.bpf.h with a small harness program (a sched_switch tracepoint
that calls py_stack for the thread leaving the CPU and keeps its last id), run a known script under
each CPython 3.11 here (Debian's static /usr/bin/python3.11, and this venv's interpreter, which maps a
shared libpython like Ubuntu's python3.12) and check the frames named for a busy and a sleeping thread.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import require_ebpf

from ingero_mcp.collector.elfsym import ElfFile, NotElf
from ingero_mcp.collector.pyframes import (
    OFFSETS,
    PythonFrames,
    debug_offsets,
    find_interpreter,
    header_path,
    pid_namespace,
    thread_ids,
)

SCRIPT = '''\
import os, sys, threading, time


def write_checkpoint(path):
    with open(path, "wb") as f:
        while True:
            f.write(b"x")
            os.fsync(f.fileno())
            time.sleep(0.002)


def build_batch():
    total = 0
    for i in range(100000):
        total += i * i
    return total


def train_step():
    return build_batch()


def größe():
    while True:
        time.sleep(0.003)


def 批次():
    while True:
        time.sleep(0.003)


threading.Thread(target=write_checkpoint, args=(sys.argv[1],), daemon=True).start()
threading.Thread(target=größe, daemon=True).start()
threading.Thread(target=批次, daemon=True).start()
print("ready", flush=True)
while True:
    train_step()
'''
DEF_LINES = {"write_checkpoint": 4, "build_batch": 12, "train_step": 19, "größe": 23, "批次": 28}

HARNESS = r'''
BPF_HASH(py_watch, u32, u8, 64);          // tgids whose switch-outs call py_stack (configured or not)
BPF_HASH(py_last, u32, u64, 4096);        // tid -> the id py_stack returned at its last switch-out
TRACEPOINT_PROBE(sched, sched_switch) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 tid = args->prev_pid;
    if (!py_watch.lookup(&tgid))
        return 0;
#ifdef NO_WALK
    u64 id = py_procs.lookup(&tgid) ? 1 : 0;
#else
    u64 id = py_stack(tgid, tid);
#endif
    py_last.update(&tid, &id);
    return 0;
}

BPF_HASH(py_sampled, u64, u64, 1024);     // a perf-event sample's py_stack id -> how many samples
int on_sample(struct bpf_perf_event_data *ctx) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32;
    if (!py_watch.lookup(&tgid))
        return 0;
    u64 id = py_stack(tgid, (u32)pt);
    py_sampled.increment(id);
    return 0;
}
'''


def interpreters() -> list[str]:
    """CPython 3.11 executables here: the system's static one and this venv's (shared libpython)."""
    found = [p for p in ("/usr/bin/python3.11",) if os.access(p, os.X_OK)]
    if sys.version_info[:2] == (3, 11) and os.path.realpath(sys.executable) not in map(os.path.realpath, found):
        found.append(sys.executable)
    return found


# ---- pure: ELF symbols and the interpreter of a process ------------------------------------------

def test_elf_symbol_and_load_bias_match_the_dynamic_linker(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the test library")
    src = tmp_path / "t.c"
    src.write_text("int ingero_answer[4] = {42, 7, 0, 1};\nint ingero_other(void) { return 3; }\n")
    lib = tmp_path / "libt.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O0", "-o", str(lib), str(src)], check=True)
    handle = ctypes.CDLL(str(lib))
    real = ctypes.addressof(ctypes.c_int.in_dll(handle, "ingero_answer"))
    elf = ElfFile.open(lib)
    sym = elf.symbol("ingero_answer")
    assert sym is not None and sym[1] == 16
    assert elf.read_at(sym[0], 4) == (42).to_bytes(4, "little")
    mine = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 6 and os.path.realpath(parts[5]) == os.path.realpath(lib):
                mine.append((int(parts[0].split("-")[0], 16), int(parts[2], 16)))
    bias = elf.load_bias(mine)
    assert bias is not None and bias + sym[0] == real
    assert elf.symbol("no_such_symbol") is None
    (tmp_path / "text").write_text("not an ELF file at all, long enough to fill a header" * 2)
    with pytest.raises(NotElf):
        ElfFile.open(tmp_path / "text")


def test_this_interpreter_is_found_with_its_runtime_address() -> None:
    interp = find_interpreter(os.getpid())
    assert interp is not None
    assert interp.version == sys.version_info[:2]
    runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    assert interp.runtime == runtime


def test_offsets_table_covers_the_versions_walked() -> None:
    assert sorted(OFFSETS) == [(3, 11), (3, 12), (3, 13)]
    for off in OFFSETS.values():
        assert max(off.ts_tid, off.ts_frame) + 8 - min(off.ts_tid, off.ts_frame) <= 128  # PY_TS_WIN
        assert max(off.f_code, off.f_previous) + 8 <= 72 and (off.f_owner == 0xFFFF or off.f_owner < 72)


class _FakeMem:
    """A _PyRuntime image as 3.13 lays out its _Py_DebugOffsets (from py-spy's v3.13.0 bindings)."""

    def __init__(self, free_threaded: int = 0) -> None:
        self.raw = bytearray(584)
        struct.pack_into("<8sQQ", self.raw, 0, b"xdebugpy", 0x030D05F0, free_threaded)
        for field, value in {40: 632, 72: 7344, 168: 8, 176: 16, 184: 72, 200: 160, 232: 8, 240: 0, 264: 70,
                             280: 112, 296: 128, 312: 68, 560: 40}.items():
            struct.pack_into("<Q", self.raw, field, value)

    def read(self, addr: int, size: int) -> bytes:
        return bytes(self.raw[addr - 0x1000: addr - 0x1000 + size])


def test_debug_offsets_of_3_13_are_read_from_the_process() -> None:
    base = dataclasses.replace(OFFSETS[(3, 12)], cframe_frame=0xFFFF)  # 3.12's numbers, to be overridden
    off = debug_offsets(_FakeMem(), 0x1000, base)  # type: ignore[arg-type]
    assert off == OFFSETS[(3, 13)]  # the table and what the process publishes agree, field by field
    with pytest.raises(ValueError, match="free-threaded"):
        debug_offsets(_FakeMem(free_threaded=1), 0x1000, OFFSETS[(3, 13)])  # type: ignore[arg-type]


def test_offsets_of_3_11_match_the_installed_headers(tmp_path: Path) -> None:
    gcc, headers = shutil.which("gcc"), Path("/usr/include/python3.11/internal/pycore_frame.h")
    if gcc is None or not headers.is_file():
        pytest.skip("gcc and python3.11-dev's internal headers are needed")
    fields = {"interp_head": "_PyRuntimeState, interpreters.head", "threads_head": "PyInterpreterState, threads.head",
              "ts_next": "PyThreadState, next", "ts_interp": "PyThreadState, interp",
              "ts_tid": "PyThreadState, native_thread_id", "ts_frame": "PyThreadState, cframe",
              "cframe_frame": "_PyCFrame, current_frame", "f_code": "_PyInterpreterFrame, f_code",
              "f_previous": "_PyInterpreterFrame, previous", "co_name": "PyCodeObject, co_qualname",
              "co_filename": "PyCodeObject, co_filename", "co_firstlineno": "PyCodeObject, co_firstlineno"}
    prints = "".join(f'printf("{k} %zu\\n", offsetof({v}));\n' for k, v in fields.items())
    src = tmp_path / "off.c"
    src.write_text("#define Py_BUILD_CORE 1\n#include <Python.h>\n#include <stddef.h>\n#include <stdio.h>\n"
                   '#include "internal/pycore_runtime.h"\n#include "internal/pycore_interp.h"\n'
                   '#include "internal/pycore_frame.h"\nint main(void) {\n' + prints +
                   'printf("str_ascii %zu\\nstr_compact %zu\\n", sizeof(PyASCIIObject), '
                   "sizeof(PyCompactUnicodeObject));\nreturn 0;\n}\n")
    subprocess.run([gcc, "-I/usr/include/python3.11", "-o", str(tmp_path / "off"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "off")], capture_output=True, text=True, check=True).stdout
    got = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert got == {k: getattr(OFFSETS[(3, 11)], k) for k in got}


# ---- eBPF: the walk on real interpreters ----------------------------------------------------------

def load_harness(cflags: list[str] | None = None) -> Any:
    from ingero_mcp.collector.bccload import import_bcc

    text = ("#include <uapi/linux/ptrace.h>\n#include <uapi/linux/bpf_perf_event.h>\n"
            + header_path().read_text() + HARNESS)
    return import_bcc().BPF(text=text, cflags=cflags or [])


@pytest.fixture(scope="module")
def bpf() -> Iterator[Any]:
    require_ebpf()
    b = load_harness()
    yield b
    b.cleanup()


def watch(bpf: Any, pid: int) -> None:
    w = bpf["py_watch"]
    w[w.Key(pid)] = w.Leaf(1)


def last_ids(bpf: Any, pid: int) -> dict[int, int]:
    tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    return {k.value: v.value for k, v in bpf["py_last"].items() if k.value in tids}


@pytest.mark.ebpf
@pytest.mark.parametrize("python", interpreters())
def test_frames_name_busy_and_sleeping_threads(bpf: Any, python: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([python, str(script), str(tmp_path / "ckpt")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        frames = PythonFrames(bpf)
        version, walkable, note = frames.add_process(proc.pid)
        assert (version, walkable, note) == ("3.11", True, None)
        watch(bpf, proc.pid)
        found: dict[str, list[tuple[str, str | None, int | None]]] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(found) < len(DEF_LINES) - 1:
            time.sleep(0.2)
            for tid, py_id in last_ids(bpf, proc.pid).items():
                stack = frames.frames(proc.pid, py_id) if py_id else None
                if stack and stack[0][0] in DEF_LINES:
                    found[stack[0][0]] = stack
                    assert (tid == proc.pid) == (stack[0][0] == "build_batch")  # the busy one is the main thread
        assert set(found) == set(DEF_LINES) - {"train_step"}, (found, frames.counters())
        busy = found["build_batch"]
        assert busy[:3] == [("build_batch", str(script), DEF_LINES["build_batch"]),
                            ("train_step", str(script), DEF_LINES["train_step"]),
                            ("<module>", str(script), 1)]
        sleeping = found["write_checkpoint"]
        assert sleeping[0] == ("write_checkpoint", str(script), DEF_LINES["write_checkpoint"])
        assert sleeping[1][0] == "Thread.run" and sleeping[1][1] is not None and sleeping[1][1].endswith("threading.py")
        # names beyond ASCII: latin-1 (1 byte a character) and UCS-2 strings, decoded exactly
        for name in ("größe", "批次"):
            assert found[name][0] == (name, str(script), DEF_LINES[name])
        assert frames.truncated(proc.pid, next(i for i in last_ids(bpf, proc.pid).values() if i)) is False
        counts = frames.counters()
        assert counts["calls"] > 0 and counts["stack_full"] == 0 and counts["code_full"] == 0
        assert counts["walks"] < counts["calls"]  # thread states come from the per-tid cache
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.ebpf
def test_process_in_its_own_pid_namespace(bpf: Any, tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux unshare is needed")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([unshare, "--pid", "--fork", "--kill-child", sys.executable, str(script),
                             str(tmp_path / "ckpt")], stdout=subprocess.PIPE, text=True)
    py = 0
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        py = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        assert pid_namespace(py) is not None and 1 in thread_ids(py)  # pid 1 in its namespace
        frames = PythonFrames(bpf)
        assert frames.add_process(py) == ("3.11", True, None)
        watch(bpf, py)
        stack = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (stack and stack[0][0] == "build_batch"):
            time.sleep(0.2)
            stack = frames.frames(py, last_ids(bpf, py).get(py, 0))
        assert stack is not None and [f[0] for f in stack[:2]] == ["build_batch", "train_step"], stack
    finally:
        proc.kill()
        proc.wait()
        if py:
            try:
                os.kill(py, 9)  # the interpreter we started under unshare
            except ProcessLookupError:
                pass


FORKED = '''\
import multiprocessing as mp, time


def fetch_batch():
    total = 0
    while True:
        for i in range(20000):
            total += i
        time.sleep(0.001)


if __name__ == "__main__":
    mp.set_start_method("fork")
    worker = mp.Process(target=fetch_batch, daemon=True)
    worker.start()
    print("ready", worker.pid, flush=True)
    while True:
        time.sleep(0.01)
'''


@pytest.mark.ebpf
def test_forked_worker_is_walked_like_a_dataloader_worker(bpf: Any, tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text(FORKED)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline().split()[1])
        frames = PythonFrames(bpf)
        # The parent says "ready" once fork() returned; until the child has run CPython's after-fork code its one
        # thread state still carries the parent's thread id, and the offsets cannot be confirmed yet: ask again.
        added, deadline = frames.add_process(child), time.monotonic() + 5
        while not added[1] and time.monotonic() < deadline:
            time.sleep(0.05)
            added = frames.add_process(child)
        assert added == ("3.11", True, None)
        watch(bpf, child)
        stack = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not stack:
            time.sleep(0.2)
            stack = frames.frames(child, last_ids(bpf, child).get(child, 0))
        assert stack is not None and stack[0] == ("fetch_batch", str(script), 4)
        assert stack[1][0] == "BaseProcess.run" and stack[-1][0] == "<module>"
    finally:
        proc.kill()
        proc.wait()
        if child:
            try:
                os.kill(child, 9)  # the worker we started (a daemon child; its parent is gone)
            except ProcessLookupError:
                pass


RAW_FORK = '''\
import ctypes, time

pid = ctypes.PyDLL(None).fork()  # fork(2) itself: CPython's after-fork code not run in the child (yet)
if pid == 0:
    time.sleep(1.0)  # the window a worker seen at its fork is in: its thread state carries the parent's id
    ctypes.pythonapi.PyOS_AfterFork_Child()
    while True:
        time.sleep(0.01)
print("ready", pid, flush=True)
while True:
    time.sleep(0.01)
'''


@pytest.mark.ebpf
def test_a_child_seen_before_its_after_fork_code_is_asked_again(bpf: Any, tmp_path: Path) -> None:
    """The collector asks the walker about a process once, when first traced; a child seen before CPython's after-fork
    code ran cannot be confirmed then, and is asked again on later samples (UserStacks.retry_unconfirmed) until it
    can: its Python frames walked, not left native for the rest of the trace."""
    from ingero_mcp.collector.ustacks import UNCONFIRMED, UserStacks

    script = tmp_path / "rawfork.py"
    script.write_text(RAW_FORK)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline().split()[1])
        stacks = UserStacks(None, lambda *a: None, PythonFrames(bpf), 49)
        stacks.add_process(child)
        assert not stacks.sources[child][1] and UNCONFIRMED in (stacks.sources[child][2] or ""), stacks.sources
        deadline = time.monotonic() + 8
        while child in stacks.unconfirmed and time.monotonic() < deadline:
            time.sleep(0.1)
            stacks.retry_unconfirmed([child])
        assert stacks.sources[child] == ("3.11", True, None), stacks.sources[child]
        assert child not in stacks.unconfirmed
    finally:
        proc.kill()
        proc.wait()
        if child:
            try:
                os.kill(child, 9)
            except ProcessLookupError:
                pass


@pytest.mark.ebpf
def test_perf_event_samples_of_the_running_thread(bpf: Any, tmp_path: Path) -> None:
    from ingero_mcp.collector.bccload import import_bcc

    bcc = import_bcc()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ckpt")], stdout=subprocess.PIPE, text=True)
    bpf.attach_perf_event(ev_type=bcc.PerfType.SOFTWARE, ev_config=bcc.PerfSWConfig.CPU_CLOCK,
                          fn_name=b"on_sample", sample_freq=499)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        frames = PythonFrames(bpf)
        assert frames.add_process(proc.pid)[1]
        watch(bpf, proc.pid)
        time.sleep(1.5)
        stacks = {k.value: v.value for k, v in bpf["py_sampled"].items()}
        named = {k: frames.frames(proc.pid, k) for k in stacks if k}
        busy = sum(n for k, n in stacks.items() if named.get(k) and named[k][0][0] == "build_batch")
        assert busy > 0, (stacks, named)
        top = max((n, k) for k, n in stacks.items() if k)[1]
        assert [f[0] for f in named[top][:2]] == ["build_batch", "train_step"]  # most samples: the busy loop
    finally:
        bpf.detach_perf_event(ev_type=bcc.PerfType.SOFTWARE, ev_config=bcc.PerfSWConfig.CPU_CLOCK)
        proc.kill()
        proc.wait()


@pytest.mark.ebpf
def test_non_python_process_is_refused_and_walks_to_zero(bpf: Any) -> None:
    proc = subprocess.Popen(["bash", "-c", "while :; do sleep 0.02; done"])
    try:
        frames = PythonFrames(bpf)
        version, walkable, note = frames.add_process(proc.pid)
        assert version is None and walkable is False and note and "not a CPython" in note
        watch(bpf, proc.pid)
        # configured by hand as if it were CPython: the walk finds no thread state and returns 0
        leaf = bpf["py_procs"].Leaf()
        leaf.runtime, leaf.interp_head, leaf.threads_head, leaf.ts_tid, leaf.f_owner = 0x1000, 40, 16, 160, 0xFFFF
        bpf["py_procs"][bpf["py_procs"].Key(proc.pid)] = leaf
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and proc.pid not in last_ids(bpf, proc.pid):
            time.sleep(0.1)
        ids = last_ids(bpf, proc.pid)
        assert ids.get(proc.pid) == 0, ids
        assert frames.frames(proc.pid, 0) is None
    finally:
        PythonFrames(bpf).remove_process(proc.pid)
        proc.kill()
        proc.wait()
