"""Names of user-space code addresses in traced processes, read from the mapped files' own ELF symbols.

Not BCC's per-pid symbol cache: BCC 0.26 (Debian's) closes a descriptor it never opened while it builds one
(ProcSyms::ModulePath leaves fd_ uninitialised on one path and closes it; iovisor/bcc#5193, fixed in 0.33). In the
collector that closed an eBPF program's descriptor at random, and could as well close a map's or the store's.

Here: /proc/PID/maps, read while the process lives (warm) and again when an address falls in no known mapping (a
library loaded since, at most every REFRESH_S); per mapped file, keyed by its device and inode so processes share
it, the function symbols of .symtab, else .dynsym, sorted once; an address names the function whose
[value, value + size) holds it. The file is opened through /proc/PID/map_files (a deleted file, another mount
namespace), else /proc/PID/root, else its path. C++ names are demangled by libstdc++'s __cxa_demangle.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import numpy as np

from ingero_mcp.collector.elfsym import SHT_DYNSYM, SHT_SYMTAB, ElfFile, NotElf

REFRESH_S = 2.0  # a process's mappings are read again at most this often
NESTED_LOOKBACK = 16  # symbols looked at below an address for one that encloses it
STT_FUNC, STT_GNU_IFUNC = 2, 10
SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                ("size", "<u8")])


@dataclass(frozen=True)
class Mapping:
    """An executable file mapping of a process: [start, end) holds the file's bytes from `offset`."""

    start: int
    end: int
    offset: int
    file: tuple[int, int]  # (device, inode): the same file in every process that maps it
    path: str


class FileSymbols:
    """A file's function symbols, sorted by address; names are decoded (and demangled) when asked for."""

    def __init__(self, elf: ElfFile) -> None:
        self.elf = elf
        self.values = np.zeros(0, np.uint64)
        self.ends = np.zeros(0, np.uint64)
        self.names = np.zeros(0, np.uint32)
        self.strings = b""
        for kind in (SHT_SYMTAB, SHT_DYNSYM):  # .symtab holds .dynsym's functions and the local ones
            raw = elf.symbol_table(kind)
            if raw is None:
                continue
            syms = np.frombuffer(raw[0], SYM, count=len(raw[0]) // SYM.itemsize)
            kinds = syms["info"] & 0xF
            keep = syms[((kinds == STT_FUNC) | (kinds == STT_GNU_IFUNC)) & (syms["shndx"] != 0) & (syms["value"] != 0)]
            if len(keep):
                keep = keep[np.argsort(keep["value"], kind="stable")]
                self.values, self.names, self.strings = keep["value"], keep["name"], raw[1]
                # a symbol of size 0 (hand-written assembly) holds up to the next symbol
                nxt = np.append(self.values[1:], np.uint64(2**64 - 1))
                self.ends = np.where(keep["size"] > 0, self.values + keep["size"], nxt)
                break
        self._named: dict[int, str] = {}

    def function(self, vaddr: int) -> str | None:
        """The function holding link-time address `vaddr`, or None."""
        i = int(np.searchsorted(self.values, np.uint64(vaddr), side="right")) - 1
        # the nearest symbol below may be a small one that ended; an enclosing one starts further down
        for j in range(i, max(i - NESTED_LOOKBACK, -1), -1):
            if vaddr < int(self.ends[j]):
                return self._name(j)
        return None

    def _name(self, i: int) -> str:
        """Symbol i's name; of aliases at one address (malloc, __libc_malloc) the one with the fewest leading
        underscores, then the shortest: the name a caller wrote."""
        name = self._named.get(i)
        if name is None:
            lo, hi = i, i
            while lo > 0 and self.values[lo - 1] == self.values[i]:
                lo -= 1
            while hi + 1 < len(self.values) and self.values[hi + 1] == self.values[i]:
                hi += 1
            raws = [self._raw(k) for k in range(lo, hi + 1)]
            raw = min(raws, key=lambda r: (len(r) - len(r.lstrip(b"_")), len(r), r))
            name = demangle(raw) or raw.decode("utf-8", "replace")
            for k in range(lo, hi + 1):
                self._named[k] = name
        return name

    def _raw(self, i: int) -> bytes:
        at = int(self.names[i])
        return self.strings[at:self.strings.find(b"\0", at)]


class UserSymbols:
    """resolve(pid, address) -> (function, module basename); `warm(pid)` reads the mappings now, while the
    process lives; `forget(pid)` drops them (an exec: other code at the same addresses)."""

    def __init__(self) -> None:
        self.maps: dict[int, tuple[list[int], list[Mapping], float]] = {}  # pid -> (starts, mappings, read at)
        self.files: dict[tuple[int, int], FileSymbols | None] = {}

    def warm(self, pid: int, fresh: bool = False) -> None:
        got = self.maps.get(pid)
        if got is not None and not (fresh and time.monotonic() - got[2] > REFRESH_S):
            return
        mappings = read_maps(pid)
        if mappings is None:  # gone: keep what was read while it lived
            if got is None:
                self.maps[pid] = ([], [], time.monotonic())
            return
        self.maps[pid] = ([m.start for m in mappings], mappings, time.monotonic())

    def forget(self, pid: int) -> None:
        self.maps.pop(pid, None)

    def _mapping(self, pid: int, addr: int) -> Mapping | None:
        starts, mappings, _ = self.maps[pid]
        i = bisect_right(starts, addr) - 1
        return mappings[i] if i >= 0 and addr < mappings[i].end else None

    def __call__(self, pid: int, addr: int) -> tuple[str, str | None]:
        self.warm(pid)
        m = self._mapping(pid, addr)
        if m is None:
            self.warm(pid, fresh=True)
            m = self._mapping(pid, addr)
        if m is None:
            return f"0x{addr:x}", None
        module = os.path.basename(m.path)
        if m.file not in self.files:
            self.files[m.file] = _load(pid, m)
        syms = self.files[m.file]
        file_offset = addr - m.start + m.offset
        vaddr = syms.elf.link_address(file_offset) if syms is not None else None
        name = syms.function(vaddr) if syms is not None and vaddr is not None else None
        # unnamed: the link-time address where known (what addr2line and gdb take), else the file offset
        return (name or f"0x{file_offset if vaddr is None else vaddr:x}"), module


def read_maps(pid: int) -> list[Mapping] | None:
    """The executable file mappings of a process, by start address (None: it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        path = parts[5].removesuffix(" (deleted)")
        out.append(Mapping(start, end, int(parts[2], 16), (os.makedev(major, minor), int(parts[4])), path))
    out.sort(key=lambda m: m.start)
    return out


def _load(pid: int, m: Mapping) -> FileSymbols | None:
    """The symbols of a mapping's file, opened where it is that file (same inode), or None."""
    for path in (f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}", f"/proc/{pid}/root{m.path}", m.path):
        try:
            if os.stat(path).st_ino != m.file[1]:
                continue
            return FileSymbols(ElfFile.open(path))
        except (OSError, NotElf, ValueError):
            continue
    return None


@functools.cache
def _cxa_demangle() -> tuple[Any, Any] | None:
    """libstdc++'s __cxa_demangle and libc's free, or None where libstdc++ cannot be loaded."""
    try:
        fn = ctypes.CDLL("libstdc++.so.6").__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return fn, free


def demangle(raw: bytes) -> str | None:
    """A C++ symbol's name as written in the source, or None: not a C++ name, or no demangler here."""
    cxa = _cxa_demangle() if raw.startswith(b"_Z") else None
    if cxa is None:
        return None
    status = ctypes.c_int(0)
    out = cxa[0](raw, None, None, ctypes.byref(status))
    if not out:
        return None
    try:
        return ctypes.string_at(out).decode("utf-8", "replace") if status.value == 0 else None
    finally:
        cxa[1](out)
