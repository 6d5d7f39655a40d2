"""User stacks of traced threads: the eBPF user stack map's ids turned into stable ids and `stacks` rows, the
on-CPU sampler attached, and how each process's stacks were taken (`stack_sources`).

The eBPF program takes a thread's user stack (frame-pointer walk, innermost first) where it takes the kernel
stack (a switch-out into sleep) and at each on-CPU sample, with the id of its Python stack (pyframes.bpf.h).
Here each new (pid, map id, Python id) is read once, symbolised against the process's own mappings (usyms.py,
read while the process lives; module = the mapped file's basename) and given an id that is a
hash of its frames (kstacks.stack_id). A stack with a Python id becomes one 'python' stack: the native frames
up to the first interpreter frame, then the Python frames; else one 'user' stack of native frames.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from ingero_mcp.collector.kstacks import STACKS_SCHEMA, stack_id
from ingero_mcp.collector.pyframes import PythonFrames

Resolve = Callable[[int, int], tuple[str, str | None]]  # (pid, address) -> (function, module basename)
Row = tuple[int, str, list[str], list[str | None], list[str | None] | None, list[int | None] | None]

DEFAULT_STACK_HZ = 49  # on-CPU samples per second per CPU (--stack-hz); off the 50/100 Hz of periodic work
PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK = 1, 0
INTERPRETER_MODULE = re.compile(r"^(lib)?python\d")  # libpython3.12.so.1.0, python3.12, python3
NO_FRAME_POINTERS = "built without frame pointers: native stacks stop at the first frame"
STACK_SOURCES_SCHEMA = pa.schema([
    ("pid", pa.int32()), ("python", pa.string()), ("python_frames", pa.bool_()), ("frame_pointers", pa.bool_()),
    ("sample_hz", pa.int32()), ("note", pa.string()),
])


def attach_sampler(bpf: Any, hz: int) -> str | None:
    """Attach the on-CPU sampler (a software CPU-clock event per CPU, `hz` a second); the error, if it failed."""
    if hz <= 0:
        return None
    try:
        bpf.attach_perf_event(ev_type=PERF_TYPE_SOFTWARE, ev_config=PERF_COUNT_SW_CPU_CLOCK, fn_name=b"perf_sample",
                              sample_freq=hz)
    except Exception as exc:  # noqa: BLE001 - no perf events here (a VM, perf_event_paranoid): stacks at switch-outs
        return f"{type(exc).__name__}: {exc}"
    return None


# A process first seen right at its fork (a DataLoader worker): until the child has run CPython's after-fork code its
# thread state carries the parent's thread id and the walker's offsets cannot be confirmed. Asked again at most every
# RETRY_EVERY_S on later samples, for RETRY_FOR_S after the first ask.
RETRY_EVERY_S, RETRY_FOR_S = 0.2, 10.0
UNCONFIRMED = "offsets not confirmed"
SAMPLE_PROBE = "stack_sample"  # probe_costs.probe: the on-CPU sampler's time per sample (analysis/cost.py)
# The sampler's kernel time per sample where this host did not measure it: perf_sample's run time / runs as the kernel
# timed it on the H200 (kernel.bpf_stats_enabled=1, bench/README.md "Stacks on the H200"): 4.3 us.
SAMPLE_COST_DEFAULT_NS = 4300.0


def sample_cost_row(run_stats: dict[str, dict] | None) -> dict[str, Any]:
    """probe_costs' row for the sampler (less session_id): the kernel's own timing of perf_sample where it was on
    (kernel.bpf_stats_enabled=1), else the H200's figure, saying which."""
    got = (run_stats or {}).get("perf_sample") or {}
    runs, ns = int(got.get("run_cnt") or 0), int(got.get("run_time_ns") or 0)
    if runs:
        return {"probe": SAMPLE_PROBE, "cost_ns": ns / runs, "method": f"measured by the kernel: perf_sample's run "
                f"time / its {runs:,} runs (kernel.bpf_stats_enabled=1)", "site": None}
    return {"probe": SAMPLE_PROBE, "cost_ns": SAMPLE_COST_DEFAULT_NS, "method": "default: not measured here "
            "(kernel.bpf_stats_enabled=0); the kernel's timing of perf_sample on an H200 host, 4.3 us a sample",
            "site": None}


def detach_sampler(bpf: Any) -> None:
    """Stop the on-CPU sampler, if it runs."""
    if (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK) in getattr(bpf, "open_perf_events", {}):
        bpf.detach_perf_event(ev_type=PERF_TYPE_SOFTWARE, ev_config=PERF_COUNT_SW_CPU_CLOCK)


def is_interpreter(function: str, module: str | None) -> bool:
    """A frame of the CPython interpreter itself (its eval loop, libpython, the python executable)."""
    return function == "_PyEval_EvalFrameDefault" or bool(module and INTERPRETER_MODULE.match(module))


class UserStacks:
    """Resolves user stack ids as the records carrying them arrive; keeps the rows of stacks not yet stored and, per
    traced process, how its stacks were taken."""

    def __init__(self, table: Any, resolve: Resolve, pyframes: PythonFrames | Any, sample_hz: int) -> None:
        self.table = table
        self.resolve = resolve
        self.pyframes = pyframes
        self.sample_hz = sample_hz
        self.ids: dict[tuple[int, int, int], int | None] = {}  # (pid, map id, python id) -> stable id
        self._native: dict[tuple[int, int], list[tuple[str, str | None]] | None] = {}
        self._symbols: dict[tuple[int, int], tuple[str, str | None]] = {}
        self._new: list[Row] = []
        self._stored: set[int] = set()
        self.unreadable = 0
        self.sources: dict[int, tuple[str | None, bool, str | None]] = {}  # pid -> add_process's answer
        self.depths: dict[int, list[int]] = {}  # pid -> [native stacks read, of them deeper than 2 frames]
        self.sources_dirty = False
        self.unconfirmed: dict[int, tuple[float, float]] = {}  # pid -> (first ask, last ask), monotonic seconds

    def add_process(self, pid: int) -> None:
        """A traced process first seen: its mappings read while it lives, the Python walker told about it."""
        if pid in self.sources:
            return
        warm = getattr(self.resolve, "warm", None)
        try:
            if warm is not None:
                warm(pid)
        except Exception:  # noqa: BLE001, S110 - a process gone: its stacks stay unresolved, the walker says why
            pass
        self._ask_walker(pid)

    def _ask_walker(self, pid: int) -> None:
        """The Python walker's answer for a process; an unconfirmed one (a child before its after-fork code ran) is
        asked again on later samples (retry_unconfirmed)."""
        try:
            self.sources[pid] = self.pyframes.add_process(pid)
        except Exception as exc:  # noqa: BLE001 - a process gone, a walker's failure: its stacks stay native
            self.sources[pid] = (None, False, f"Python frames not walked: {type(exc).__name__}: {exc}")
        now = time.monotonic()
        if UNCONFIRMED in (self.sources[pid][2] or ""):
            self.unconfirmed[pid] = (self.unconfirmed.get(pid, (now, now))[0], now)
        else:
            self.unconfirmed.pop(pid, None)
        self.sources_dirty = True

    def retry_unconfirmed(self, pids: list[int] | None = None) -> None:
        """Ask the walker again about processes whose offsets were not confirmed yet (of `pids`, or all), each at most
        every RETRY_EVERY_S and for RETRY_FOR_S after the first ask; then their answer stands."""
        now = time.monotonic()
        for pid in list(self.unconfirmed if pids is None else set(pids) & self.unconfirmed.keys()):
            first, last = self.unconfirmed[pid]
            if now - first > RETRY_FOR_S:
                del self.unconfirmed[pid]
            elif now - last >= RETRY_EVERY_S:
                self._ask_walker(pid)

    def forget(self, pid: int) -> None:
        """A process exec'd: its addresses mean other code from now on (its stacks already stored stay)."""
        forget = getattr(self.resolve, "forget", None)
        if forget is not None:
            forget(pid)
        for cache in (self.ids, self._native, self._symbols):
            for key in [k for k in cache if k[0] == pid]:
                del cache[key]
        # The walker's config pointed into the old image: drop it, and ask again what the new program is.
        remove = getattr(self.pyframes, "remove_process", None)
        if remove is not None and pid in self.sources:
            try:
                remove(pid)
            except Exception:  # noqa: BLE001, S110 - a config already gone
                pass
            del self.sources[pid]
            self.add_process(pid)

    def _native_frames(self, pid: int, map_id: int) -> list[tuple[str, str | None]] | None:
        key = (pid, map_id)
        if key in self._native:
            return self._native[key]
        try:
            leaf = self.table[self.table.Key(map_id)]
        except KeyError:
            self._native[key] = None
            return None
        frames: list[tuple[str, str | None]] = []
        for addr in leaf.ip:
            if not addr:
                break
            sym = self._symbols.get((pid, addr))
            if sym is None:
                sym = self._symbols[(pid, addr)] = self.resolve(pid, int(addr))
            if frames and sym[1] is None:
                # a return address in no mapped file: the walk left the frame chain (code without frame
                # pointers keeps data in rbp); what follows is noise, which would also split one stack into many
                break
            frames.append(sym)
        self._native[key] = frames or None
        if frames:
            seen = self.depths.setdefault(pid, [0, 0])
            seen[0] += 1
            seen[1] += len(frames) > 2
            self.sources_dirty = True
        return frames or None

    def _resolve(self, pid: int, map_id: int, py_id: int) -> int | None:
        key = (pid, map_id, py_id)
        if key in self.ids:
            return self.ids[key]
        native = self._native_frames(pid, map_id) if map_id >= 0 else []
        py = self.pyframes.frames(pid, py_id) if py_id else None
        row: Row | None = None
        if py:
            head = []
            for fn, mod in native or []:
                if is_interpreter(fn, mod):
                    break
                head.append((fn, mod))
            frames = [fn for fn, _ in head] + [f for f, _, _ in py]
            modules = [m for _, m in head] + [None] * len(py)
            files = [None] * len(head) + [f for _, f, _ in py]
            lines = [None] * len(head) + [ln for _, _, ln in py]
            row = (stack_id(frames, modules, files, lines), "python", frames, modules, files, lines)
        elif native:
            frames, modules = [fn for fn, _ in native], [m for _, m in native]
            row = (stack_id(frames, modules), "user", frames, modules, None, None)
        sid = None if row is None else row[0]
        self.ids[key] = sid
        if row is None:
            self.unreadable += 1
        elif row[0] not in self._stored:
            self._stored.add(row[0])
            self._new.append(row)
        return sid

    def column(self, pids: np.ndarray, map_ids: np.ndarray, py_ids: np.ndarray) -> pa.Array:
        """Stable ids for records' (pid, map id, Python id) (map id < 0 and no Python id: not taken -> NULL)."""
        taken = (map_ids >= 0) | (py_ids != 0)  # preemptions take no stack: most intervals, skipped here
        if not taken.any():
            return pa.nulls(len(pids), pa.int64())
        if self.unconfirmed:
            self.retry_unconfirmed(np.unique(pids[taken]).tolist())
        keys = np.empty(int(taken.sum()), dtype=[("pid", "<i8"), ("map", "<i8"), ("py", "<u8")])
        keys["pid"], keys["map"], keys["py"] = pids[taken], map_ids[taken], py_ids[taken]
        uniq, inverse = np.unique(keys, return_inverse=True)
        found = [self._resolve(p, m, y) for p, m, y in uniq.tolist()]
        ids = np.array([0 if sid is None else sid for sid in found], np.int64)[inverse.reshape(-1)]
        known = np.array([sid is not None for sid in found], bool)[inverse.reshape(-1)]
        out, valid = np.zeros(len(pids), np.int64), np.zeros(len(pids), bool)
        out[taken], valid[taken] = ids, known
        return pa.array(out, pa.int64(), mask=~valid)

    def one(self, pid: int, map_id: int, py_id: int) -> int | None:
        """The stable id of one record's stack (an interval still open at the stop)."""
        return self._resolve(int(pid), int(map_id), int(py_id)) if map_id >= 0 or py_id else None

    @property
    def distinct(self) -> int:
        """Distinct stacks resolved so far (each one `stacks` row)."""
        return len(self._stored)

    def take_rows(self) -> pa.Table | None:
        """`stacks` rows for the stacks first seen since the last call."""
        if not self._new:
            return None
        new, self._new = self._new, []
        return pa.table([pa.array([r[i] for r in new], t) for i, t in enumerate(STACKS_SCHEMA.types)],
                        schema=STACKS_SCHEMA)

    def frame_pointers(self, pid: int) -> bool | None:
        """Whether this process's native stacks go past the leaf (most deeper than 2 frames); None: none read."""
        total, deep = self.depths.get(pid, (0, 0))
        return None if not total else 2 * deep > total

    def sources_table(self) -> pa.Table:
        """stack_sources rows: each traced process seen, its Python walker's answer and its frame pointers."""
        rows = []
        for pid, (version, walked, note) in sorted(self.sources.items()):
            fp = self.frame_pointers(pid)
            notes = [n for n in (note, NO_FRAME_POINTERS if fp is False else None) if n]
            rows.append((pid, version, bool(walked), fp, self.sample_hz, "; ".join(notes) or None))
        return pa.table([pa.array([r[i] for r in rows], t) for i, t in enumerate(STACK_SOURCES_SCHEMA.types)],
                        schema=STACK_SOURCES_SCHEMA)
