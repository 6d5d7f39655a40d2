"""Python frames of traced CPython processes: configures collectors/pyframes.bpf.h and reads its maps.

`add_process` finds the interpreter (a mapped libpython3.X.so, else the executable), its version and
the address of `_PyRuntime` (ELF symbol + load bias), checks the version's struct offsets against the
live process (its thread-state list must lead back to its interpreter and name one of its threads)
and writes them into the BPF map `py_procs`. `frames` turns a stack id from `py_stack` into
(function, file, first line of the def), innermost first.
"""

from __future__ import annotations

import ctypes as ct
import os
import re
import struct
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ingero_mcp.collector.elfsym import ElfFile, NotElf

NO_OFF = 0xFFFF
SHIM = 1  # a frame slot holding an entry (shim) frame of the C stack (pyframes.bpf.h PY_SHIM)
DEBUG_COOKIE = b"xdebugpy"
PAGE = 4096


@dataclass(frozen=True)
class Offsets:
    """Struct offsets (x86_64) that py_stack needs for one CPython minor version."""

    interp_head: int       # _PyRuntimeState.interpreters.head
    threads_head: int      # PyInterpreterState.threads.head
    ts_next: int           # PyThreadState.next
    ts_interp: int         # PyThreadState.interp (checked here, not read in BPF)
    ts_tid: int            # PyThreadState.native_thread_id
    ts_frame: int          # PyThreadState.cframe (3.11, 3.12) / .current_frame (3.13)
    cframe_frame: int      # _PyCFrame.current_frame, NO_OFF: ts_frame is the frame pointer
    f_code: int            # _PyInterpreterFrame.f_code (f_executable in 3.13)
    f_previous: int
    f_owner: int           # NO_OFF: no entry frames owned by the C stack (3.11)
    co_name: int           # co_qualname
    co_filename: int
    co_firstlineno: int
    str_ascii: int         # sizeof(PyASCIIObject): data of a compact ASCII str
    str_compact: int       # sizeof(PyCompactUnicodeObject): data of a compact non-ASCII str


# How these were obtained (x86_64, release builds): 3.11 with gcc `offsetof` against Debian's
# /usr/include/python3.11 (Py_BUILD_CORE, internal headers); 3.12 and 3.13 with rustc `offset_of!`
# over py-spy's bindgen bindings of the v3.12.0 / v3.13.0 headers (src/python_bindings/v3_1X_0.rs),
# which give gcc's numbers for 3.11 too; _PyRuntimeState.interpreters.head for 3.11 (not in those
# bindings) by gcc. Cross-checked with Meta's strobelight pyperf tables (3.12.4 dumped with lldb from a
# live process: cframe 56, thread_id 136 with the native id next, frame code 0 / previous 8 / owner 70,
# co_filename 112, co_qualname 128, co_firstlineno 68, str data 40; their 3.13 table agrees with ours).
# For 3.13 the process's own _Py_DebugOffsets (at the start of _PyRuntime) override these. Layouts
# are stable within a minor version; each process is still checked (_verify) before it is configured.
OFFSETS: dict[tuple[int, int], Offsets] = {
    (3, 11): Offsets(interp_head=40, threads_head=16, ts_next=8, ts_interp=16, ts_tid=160, ts_frame=56,
                     cframe_frame=8, f_code=32, f_previous=48, f_owner=NO_OFF, co_name=128, co_filename=112,
                     co_firstlineno=72, str_ascii=48, str_compact=72),
    (3, 12): Offsets(interp_head=40, threads_head=72, ts_next=8, ts_interp=16, ts_tid=144, ts_frame=56,
                     cframe_frame=0, f_code=0, f_previous=8, f_owner=70, co_name=128, co_filename=112,
                     co_firstlineno=68, str_ascii=40, str_compact=56),
    (3, 13): Offsets(interp_head=632, threads_head=7344, ts_next=8, ts_interp=16, ts_tid=160, ts_frame=72,
                     cframe_frame=NO_OFF, f_code=0, f_previous=8, f_owner=70, co_name=128, co_filename=112,
                     co_firstlineno=68, str_ascii=40, str_compact=56),
}
# 3.10 (PyFrameObject chain: tstate.frame 24, f_back 24, f_code 32; co_name 112, co_filename 104,
# co_firstlineno 40) has no native_thread_id in its thread state, only pthread_self(): not walked.
NOTES = {(3, 10): "CPython 3.10: its thread states carry no native thread id; native frames only"}

# _Py_DebugOffsets (3.13.0 layout, from the same bindings): field -> byte offset in the struct
DEBUG_FIELDS_313 = {"version": 8, "interp_head": 40, "threads_head": 72, "ts_next": 168, "ts_interp": 176,
                    "ts_frame": 184, "ts_tid": 200, "f_previous": 232, "f_code": 240, "f_owner": 264,
                    "co_filename": 280, "co_name": 296, "co_firstlineno": 312, "str_ascii": 560}

_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)[a-z]*\.so")
_EXE = re.compile(r"python(\d+)\.(\d+)[a-z]*$")


@dataclass
class Interpreter:
    """Where a process's CPython lives: the ELF file defining _PyRuntime and its address there."""

    path: str
    version: tuple[int, int] | None
    runtime: int


def _maps(pid: int) -> list[tuple[int, int, str]]:
    """(start, file offset, path) of the file-backed mappings of a process."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                start = int(parts[0].split("-")[0], 16)
                out.append((start, int(parts[2], 16), parts[5].rstrip("\n").removesuffix(" (deleted)")))
    return out


def _in_root(pid: int, path: str) -> str:
    """The path as seen from here (through /proc/PID/root for a process in another mount namespace)."""
    rooted = f"/proc/{pid}/root{path}"
    return rooted if os.path.exists(rooted) else path


def _version_of(elf: ElfFile, path: str) -> tuple[int, int] | None:
    """(major, minor): Py_Version (3.11+) read from the file, else the file name."""
    sym = elf.symbol("Py_Version")
    if sym:
        raw = elf.read_at(sym[0], 4)
        if raw:
            hexversion = struct.unpack("<I", raw)[0]
            return hexversion >> 24, (hexversion >> 16) & 0xFF
    m = _LIBPYTHON.search(os.path.basename(path)) or _EXE.search(os.path.basename(path))
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_interpreter(pid: int) -> Interpreter | None:
    """The CPython of a process (a mapped libpython3.X.so first, else its executable); None if not CPython."""
    maps = _maps(pid)
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        exe = ""
    paths = sorted({p for _s, _o, p in maps if _LIBPYTHON.search(os.path.basename(p))})
    for path in [*paths, exe]:
        mine = [(s, o) for s, o, p in maps if p == path]
        if not mine:
            continue
        try:
            elf = ElfFile.open(_in_root(pid, path))
            sym = elf.symbol("_PyRuntime")
        except (OSError, NotElf):
            continue
        if sym is None:
            continue
        bias = elf.load_bias(mine)
        if bias is None:
            continue
        return Interpreter(path, _version_of(elf, path), sym[0] + bias)
    return None


class _Mem:
    """Reads of another process's memory through /proc/PID/mem."""

    def __init__(self, pid: int) -> None:
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)

    def read(self, addr: int, size: int) -> bytes | None:
        try:
            data = os.pread(self.fd, size, addr)
        except OSError:
            return None
        return data if len(data) == size else None

    def ptr(self, addr: int) -> int:
        data = self.read(addr, 8) if addr else None
        return struct.unpack("<Q", data)[0] if data else 0

    def close(self) -> None:
        os.close(self.fd)


def debug_offsets(mem: _Mem, runtime: int, base: Offsets) -> Offsets | None:
    """3.13: the offsets the process publishes in _Py_DebugOffsets at the start of _PyRuntime (ValueError:
    a free-threaded build, which this walk does not read)."""
    raw = mem.read(runtime, 584)
    if not raw or raw[:8] != DEBUG_COOKIE:
        return None
    vals = {k: struct.unpack_from("<Q", raw, off)[0] for k, off in DEBUG_FIELDS_313.items()}
    if (vals.pop("version") >> 16) != 0x030D:
        return None  # another layout of the struct (3.14+): not this table's
    if struct.unpack_from("<Q", raw, 16)[0]:
        raise ValueError("a free-threaded build (its objects and strings are laid out otherwise)")
    ascii_size = vals.pop("str_ascii")
    if any(v > 0xFFF0 for v in vals.values()):
        return None
    return replace(base, **vals, str_ascii=ascii_size, str_compact=ascii_size + 16)


def pid_namespace(pid: int) -> tuple[int, int] | None:
    """(nsfs dev, inode) of the process's PID namespace when it is not ours (a container), else None."""
    mine, theirs = os.stat("/proc/self/ns/pid"), os.stat(f"/proc/{pid}/ns/pid")
    same = (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)
    return None if same else (theirs.st_dev, theirs.st_ino)


def thread_ids(pid: int) -> set[int]:
    """The process's thread ids as it sees them (innermost NSpid): what native_thread_id holds."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                ns = next((line.split()[1:] for line in f if line.startswith("NSpid:")), None)
        except OSError:
            continue
        out.add(int(ns[-1]) if ns else int(tid))
    return out


def _verify(mem: _Mem, pid: int, runtime: int, off: Offsets) -> str | None:
    """None if the offsets fit the live process, else why not: every thread state of the first
    interpreter points back at it, and one of them carries the native id of a thread of the process."""
    interp = mem.ptr(runtime + off.interp_head)
    if not interp:
        return "its interpreter is not initialised yet (no interpreter in _PyRuntime)"
    tids = thread_ids(pid)
    ts, seen, named = mem.ptr(interp + off.threads_head), 0, 0
    while ts and seen < 1024:
        if mem.ptr(ts + off.ts_interp) != interp:
            return f"thread state 0x{ts:x} does not point back at interpreter 0x{interp:x}"
        named += mem.ptr(ts + off.ts_tid) in tids
        ts, seen = mem.ptr(ts + off.ts_next), seen + 1
    if not seen:
        return "its interpreter has no thread state"
    return None if named else "no thread state carries the id of one of its threads"


class PythonFrames:
    """Per-process configuration of the eBPF Python-frame walk, and the frames of its stack ids."""

    def __init__(self, bpf: Any) -> None:
        self.bpf = bpf
        self.procs = bpf["py_procs"]
        self.stacks = bpf["py_stacks"]
        self.codes = bpf["py_codes"]
        self.versions: dict[int, str | None] = {}
        self._code_cache: dict[tuple[int, int], tuple[str, str | None, int | None]] = {}
        self._stack_cache: dict[tuple[int, int], list[tuple[str, str | None, int | None]]] = {}

    def add_process(self, pid: int) -> tuple[str | None, bool, str | None]:
        """(CPython version or None, whether its frames can be walked, why not) and configures the walk."""
        try:
            interp = find_interpreter(pid)
        except OSError as exc:
            return None, False, f"process {pid} cannot be inspected: {exc.strerror or exc}"
        if interp is None:
            return None, False, "not a CPython process (no _PyRuntime in its executable or a libpython)"
        if interp.version is None:
            return None, False, f"CPython of unknown version ({interp.path}): native frames only"
        version = f"{interp.version[0]}.{interp.version[1]}"
        self.versions[pid] = version
        off = OFFSETS.get(interp.version)
        if off is None:
            note = NOTES.get(interp.version, f"CPython {version}: no offsets known, native frames only")
            return version, False, note
        try:
            mem = _Mem(pid)
        except OSError as exc:
            return version, False, f"CPython {version}: its memory cannot be read ({exc.strerror or exc})"
        try:
            if interp.version >= (3, 13):
                off = debug_offsets(mem, interp.runtime, off) or off
            why = _verify(mem, pid, interp.runtime, off)
        except ValueError as exc:
            return version, False, f"CPython {version}: {exc}; native frames only"
        finally:
            mem.close()
        if why is not None:
            return version, False, f"CPython {version} ({interp.path}): offsets not confirmed: {why}"
        self._configure(pid, interp.runtime, off, pid_namespace(pid))
        return version, True, None

    def _configure(self, pid: int, runtime: int, off: Offsets, ns: tuple[int, int] | None) -> None:
        leaf = self.procs.Leaf()
        leaf.runtime = runtime
        leaf.ns_dev, leaf.ns_ino = ns or (0, 0)
        for name in ("interp_head", "threads_head", "ts_next", "ts_tid", "ts_frame", "cframe_frame", "f_code",
                     "f_previous", "f_owner", "co_name", "co_filename", "co_firstlineno", "str_ascii",
                     "str_compact"):
            setattr(leaf, name, getattr(off, name))
        leaf.ts_win = min(off.ts_tid, off.ts_frame)
        if max(off.ts_tid, off.ts_frame) + 8 - leaf.ts_win > 128:
            raise ValueError("thread-state fields too far apart for PY_TS_WIN")
        self.procs[self.procs.Key(pid)] = leaf

    def remove_process(self, pid: int) -> None:
        """Stop walking a process (it exited); its stored stacks and names stay readable."""
        try:
            del self.procs[self.procs.Key(pid)]
        except KeyError:
            pass

    def frames(self, pid: int, py_id: int) -> list[tuple[str, str | None, int | None]] | None:
        """(function, file, first line of its def) innermost first, for a py_stack id; None if unknown."""
        if not py_id:
            return None
        key = (pid, py_id)
        cached = self._stack_cache.get(key)
        if cached is not None:
            return cached
        try:
            leaf = self.stacks[self.stacks.Key(ct.c_uint64(py_id & 0xFFFFFFFFFFFFFFFF).value)]
        except KeyError:
            return None
        if leaf.tgid != pid:
            return None
        out = [self._code(pid, int(c)) for c in list(leaf.code)[: leaf.depth] if c > SHIM]
        self._stack_cache[key] = out
        return out

    def truncated(self, pid: int, py_id: int) -> bool | None:
        """Whether the stack was deeper than the frames kept (None: unknown id)."""
        try:
            leaf = self.stacks[self.stacks.Key(py_id & 0xFFFFFFFFFFFFFFFF)]
        except KeyError:
            return None
        return bool(leaf.truncated) if leaf.tgid == pid else None

    def _code(self, pid: int, code: int) -> tuple[str, str | None, int | None]:
        got = self._code_cache.get((pid, code))
        if got is not None:
            return got
        k = self.codes.Key()
        k.tgid, k.code = pid, code
        try:
            v = self.codes[k]
        except KeyError:
            return (f"<code 0x{code:x}>", None, None)  # not stored (map full): not cached, may come later
        name = _decode(bytes(v.name)[: v.name_len], v.name_kind) + ("…" if v.name_cut else "")
        file = _decode(bytes(v.file)[: v.file_len], v.file_kind) if v.file_kind else None
        if file is not None and v.file_cut:
            file = "…" + file
        got = (name or "?", file, int(v.firstlineno) if v.firstlineno > 0 else None)
        self._code_cache[(pid, code)] = got
        return got

    def counters(self) -> dict[str, int]:
        """Totals of the walk's per-CPU counters (PYC_* in pyframes.bpf.h)."""
        names = ["calls", "no_tstate", "no_frame", "stack_full", "code_full", "truncated", "walks"]
        table = self.bpf["py_counters"]
        return {n: int(sum(table[table.Key(i)])) for i, n in enumerate(names)}


def _decode(raw: bytes, kind: int) -> str:
    """A str's raw code units: 1 byte latin-1 (ASCII included), 2 UCS-2, 4 UCS-4; never raises."""
    if kind == 2:
        return raw[: len(raw) // 2 * 2].decode("utf-16-le", "replace")
    if kind == 4:
        return raw[: len(raw) // 4 * 4].decode("utf-32-le", "replace")
    return raw.decode("latin-1")


def header_path() -> Path:
    """collectors/pyframes.bpf.h: in a source checkout, or the copy packed into the wheel."""
    repo = Path(__file__).resolve().parents[3] / "collectors" / "pyframes.bpf.h"
    return repo if repo.is_file() else Path(str(resources.files("ingero_mcp") / "collectors" / "pyframes.bpf.h"))
