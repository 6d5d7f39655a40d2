"""A small ELF64 reader: a symbol's address (.dynsym, then .symtab) and the file's load segments.

Enough to find `_PyRuntime` and `Py_Version` in a CPython executable or libpython and to turn a
link-time address into the address it has in a process (its load bias from /proc/PID/maps); no
dependency beyond the standard library. Little-endian x86_64 / aarch64 files only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

SHT_SYMTAB = 2
SHT_DYNSYM = 11
PT_LOAD = 1
ET_EXEC = 2


class NotElf(ValueError):
    """The file is not a little-endian ELF64 file."""


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD program header: where file bytes [offset, offset+filesz) are mapped at link time."""

    offset: int
    vaddr: int
    filesz: int
    memsz: int


@dataclass
class ElfFile:
    """The parts of an ELF64 file that symbol lookup and address translation need."""

    path: str
    etype: int
    segments: list[Segment]
    _sections: list[tuple[int, int, int, int, int, int]]  # (type, offset, size, link, entsize, addr)

    @classmethod
    def open(cls, path: str | Path) -> ElfFile:
        """Read the headers of `path` (raises NotElf, OSError)."""
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
                raise NotElf(f"{path}: not a little-endian ELF64 file")
            etype, = struct.unpack_from("<H", ident, 16)
            phoff, shoff = struct.unpack_from("<QQ", ident, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", ident, 54)
            segments = []
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                ptype, _flags, off, vaddr, _paddr, filesz, memsz = struct.unpack("<IIQQQQQ", f.read(48))
                if ptype == PT_LOAD:
                    segments.append(Segment(off, vaddr, filesz, memsz))
            sections = []
            for i in range(shnum if shoff else 0):
                f.seek(shoff + i * shentsize)
                raw = f.read(64)
                _name, stype, _flags, addr, off, size, link, _info, _align, entsize = struct.unpack("<IIQQQQIIQQ", raw)
                sections.append((stype, off, size, link, entsize, addr))
        return cls(str(path), etype, segments, sections)

    def symbol(self, name: str) -> tuple[int, int] | None:
        """(link-time address, size) of a defined symbol, from .dynsym then .symtab; None if absent."""
        want = name.encode()
        for kind in (SHT_DYNSYM, SHT_SYMTAB):
            raw = self.symbol_table(kind)
            found = _lookup(*raw, want) if raw else None
            if found:
                return found
        return None

    def file_offset(self, vaddr: int) -> int | None:
        """The file offset holding link-time address `vaddr` (None: not file-backed)."""
        for s in self.segments:
            if s.vaddr <= vaddr < s.vaddr + s.filesz:
                return s.offset + (vaddr - s.vaddr)
        return None

    def read_at(self, vaddr: int, size: int) -> bytes | None:
        """`size` bytes of initialised data at link-time address `vaddr`, read from the file."""
        off = self.file_offset(vaddr)
        if off is None:
            return None
        with open(self.path, "rb") as f:
            f.seek(off)
            data = f.read(size)
        return data if len(data) == size else None

    def load_bias(self, mappings: list[tuple[int, int]]) -> int | None:
        """Process address minus link-time address, from the file's mappings [(start, file offset)]."""
        page = 4096
        for start, offset in sorted(mappings, key=lambda m: m[1]):
            for s in self.segments:
                if s.offset & ~(page - 1) == offset:
                    return start - (s.vaddr & ~(page - 1))
        return None


    def symbol_table(self, kind: int) -> tuple[bytes, bytes] | None:
        """The raw entries of the first section of `kind` (SHT_SYMTAB, SHT_DYNSYM) and its string table, or None."""
        for stype, off, size, link, entsize, _addr in self._sections:
            if stype == kind and entsize == 24 and link < len(self._sections):
                strtab = self._sections[link]
                with open(self.path, "rb") as f:
                    f.seek(off)
                    table = f.read(size)
                    f.seek(strtab[1])
                    strings = f.read(strtab[2])
                return table, strings
        return None

    def link_address(self, file_offset: int) -> int | None:
        """The link-time address of the byte at `file_offset` (None: in no load segment)."""
        for s in self.segments:
            if s.offset <= file_offset < s.offset + s.filesz:
                return s.vaddr + (file_offset - s.offset)
        return None


def _lookup(table: bytes, strings: bytes, want: bytes) -> tuple[int, int] | None:
    for pos in range(0, len(table) - 23, 24):
        st_name, _info, _other, shndx, value, sz = struct.unpack_from("<IBBHQQ", table, pos)
        if shndx == 0 or not st_name:
            continue
        end = strings.find(b"\0", st_name)
        if strings[st_name:end] == want:
            return value, sz
    return None
