"""User symbols read from the mapped files (collector/usyms.py), for real: this process's libc and libpython, the
stand-in libcudart loaded in a child process, a library deleted after it was loaded, a process gone after its
mappings were read, and C++ names demangled. No eBPF: any user runs these."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import build_standin

from ingero_mcp.collector.elfsym import ElfFile
from ingero_mcp.collector.usyms import UserSymbols, demangle, read_maps

LOADER = """import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
print(ctypes.cast(lib.cudaLaunchKernel, ctypes.c_void_p).value, flush=True)
sys.stdin.readline()
"""


def _address(lib: ctypes.CDLL, name: str) -> int:
    addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    assert addr
    return addr


def test_this_process_libc_and_interpreter_functions() -> None:
    """Exported functions name themselves, inside their bodies too; of aliases (malloc, __libc_malloc) the plain."""
    syms, pid, libc = UserSymbols(), os.getpid(), ctypes.CDLL(None)
    assert syms(pid, _address(libc, "fsync")) == ("fsync", "libc.so.6")
    assert syms(pid, _address(libc, "fsync") + 4) == ("fsync", "libc.so.6")
    assert syms(pid, _address(libc, "malloc"))[0] == "malloc"
    name, module = syms(pid, _address(ctypes.pythonapi, "PyObject_Call") + 2)
    assert name == "PyObject_Call" and module is not None and module.startswith(("libpython", "python")), module


def test_an_address_in_no_file_says_so() -> None:
    syms = UserSymbols()
    assert syms(os.getpid(), 0x10) == ("0x10", None)


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin(tmp_path_factory.mktemp("usyms")).cudart


def _child(lib: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", LOADER, str(lib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_another_process_library_and_a_deleted_one(standin: Path, tmp_path: Path) -> None:
    """A library in another process resolves through its mappings; one deleted since it was loaded still does
    (opened through /proc/PID/map_files), under the name the process mapped it by."""
    copy = tmp_path / "libcudart.so.13"
    shutil.copy(standin, copy)
    proc, addr = _child(copy)
    try:
        copy.unlink()
        syms = UserSymbols()
        assert syms(proc.pid, addr) == ("cudaLaunchKernel", "libcudart.so.13")
        assert any(m.path == str(copy) for m in read_maps(proc.pid) or [])
    finally:
        proc.communicate("\n")


def test_a_process_gone_after_its_mappings_were_read(standin: Path) -> None:
    """warm() while it lives; after it exits its addresses still name their functions (the file read by path)."""
    proc, addr = _child(standin)
    syms = UserSymbols()
    syms.warm(proc.pid)
    proc.communicate("\n")
    assert read_maps(proc.pid) is None
    assert syms(proc.pid, addr) == ("cudaLaunchKernel", "libcudart.so.13")
    syms.forget(proc.pid)
    assert syms(proc.pid, addr) == (f"0x{addr:x}", None)


def test_the_link_address_of_a_symbol_is_where_it_is_mapped(standin: Path) -> None:
    """The stand-in's own symbol table agrees with the process: file offset -> link address -> the symbol."""
    proc, addr = _child(standin)
    try:
        mapping = next(m for m in read_maps(proc.pid) or [] if m.start <= addr < m.end)
        elf = ElfFile.open(standin)
        found = elf.symbol("cudaLaunchKernel")
        assert found is not None and elf.link_address(addr - mapping.start + mapping.offset) == found[0]
    finally:
        proc.communicate("\n")


def test_cpp_names_are_demangled() -> None:
    assert demangle(b"_ZN3c104impl12OperatorBase4callEv") == "c10::impl::OperatorBase::call()"
    assert demangle(b"_Znot_a_name") is None and demangle(b"cudaLaunchKernel") is None
