"""Kernel stacks taken at switch-out: the eBPF stack map's ids turned into stable ids and `stacks` rows.

The eBPF program stores each traced thread's kernel stack as it leaves the CPU in a stack map (no
reuse of ids: an id, once given, always names the same stack) and puts the map's id on the interval.
Here each new map id is read once, symbolised against /proc/kallsyms (BCC's symbol cache), and given
an id that is a hash of its frames, so one stack has one id in every session of the same kernel build.
User stacks (collector/ustacks.py) use the same hash, over their modules, files and lines as well, and the
same `stacks` row shape (STACKS_SCHEMA).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

Symbolize = Callable[[int], str]

STACKS_SCHEMA = pa.schema([
    ("stack_id", pa.int64()), ("kind", pa.string()), ("frames", pa.list_(pa.string())),
    ("modules", pa.list_(pa.string())), ("files", pa.list_(pa.string())), ("lines", pa.list_(pa.int32())),
])


def stack_id(frames: Iterable[str], modules: list[str | None] | None = None, files: list[str | None] | None = None,
             lines: list[int | None] | None = None) -> int:
    """A signed 64-bit id for a stack: a hash of its symbolised frames (innermost first), and of each frame's module,
    file and line where given (user stacks; a kernel stack's id is the hash of its frames alone, as v5 made it)."""
    frames = list(frames)
    if modules is None and files is None and lines is None:
        text = "\n".join(frames)
    else:
        cols = [c if c is not None else [None] * len(frames) for c in (modules, files, lines)]
        text = "\n".join("\t".join(["" if v is None else str(v) for v in (f, m, fi, ln)])
                         for f, m, fi, ln in zip(frames, *cols, strict=True))
    digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def bcc_symbolizer() -> Symbolize:
    """Kernel addresses -> 'function' or 'function [module]', through BCC's kallsyms cache."""
    from bcc import BPF  # type: ignore[import-not-found]

    cache = BPF._sym_cache(-1)  # noqa: SLF001 - the public ksym() hides the module for kernel symbols

    def symbolize(addr: int) -> str:
        name, _offset, module = cache.resolve(addr, False)
        if not name:
            return f"0x{addr:x}"
        text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        mod = module.decode("utf-8", "replace") if isinstance(module, bytes) else (module or "")
        return text if mod in ("", "kernel", "[kernel]") else f"{text} [{mod.strip('[]')}]"

    return symbolize


class KernelStacks:
    """Resolves the stack map's ids as intervals carrying them arrive; keeps the rows of stacks not yet stored."""

    def __init__(self, table: Any, symbolize: Symbolize) -> None:
        self.table = table
        self.symbolize = symbolize
        self.ids: dict[int, int | None] = {}  # stack map id -> stable id (None: unreadable)
        self._symbols: dict[int, str] = {}
        self._new: list[tuple[int, list[str]]] = []
        self._stored: set[int] = set()
        self.unreadable = 0

    def _frames(self, map_id: int) -> list[str] | None:
        try:
            leaf = self.table[self.table.Key(map_id)]
        except KeyError:
            return None
        frames = []
        for addr in leaf.ip:
            if not addr:
                break
            name = self._symbols.get(addr)
            if name is None:
                name = self._symbols[addr] = self.symbolize(int(addr))
            frames.append(name)
        return frames or None

    def _resolve(self, map_id: int) -> int | None:
        if map_id in self.ids:
            return self.ids[map_id]
        frames = self._frames(map_id)
        sid = None if frames is None else stack_id(frames)
        self.ids[map_id] = sid
        if sid is None:
            self.unreadable += 1
        elif sid not in self._stored:
            self._stored.add(sid)
            self._new.append((sid, frames or []))
        return sid

    def column(self, map_ids: np.ndarray) -> pa.Array:
        """Stable ids for the intervals' map ids (negative: not taken -> NULL)."""
        uniq, inverse = np.unique(map_ids.astype(np.int64), return_inverse=True)
        resolved = [self._resolve(int(m)) if m >= 0 else None for m in uniq.tolist()]
        return pa.array(resolved, pa.int64()).take(pa.array(inverse.reshape(-1).astype(np.int32)))

    def one(self, map_id: int) -> int | None:
        """The stable id of one map id (an interval still open at the stop)."""
        return self._resolve(int(map_id)) if map_id >= 0 else None

    @property
    def distinct(self) -> int:
        """Distinct stacks resolved so far (each one `stacks` row)."""
        return len(self._stored)

    def take_rows(self) -> pa.Table | None:
        """`stacks` rows for the stacks first seen since the last call."""
        if not self._new:
            return None
        new, self._new = self._new, []
        n = len(new)
        return pa.table([pa.array([s for s, _ in new], pa.int64()), pa.array(["kernel"] * n, pa.string()),
                         pa.array([f for _, f in new], pa.list_(pa.string())), *[pa.nulls(n, t) for t in
                         (pa.list_(pa.string()), pa.list_(pa.string()), pa.list_(pa.int32()))]], schema=STACKS_SCHEMA)
