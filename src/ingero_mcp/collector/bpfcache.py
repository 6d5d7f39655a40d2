"""A cache of the collector's compiled eBPF program, so that a start after the first skips clang.

BCC compiles ingero.bpf.c with clang/LLVM at every start (4-5 s of CPU). What it produces is plain
eBPF instructions per function plus a list of maps; the only thing in those instructions that
belongs to the compiling process is the file descriptor of each map, written into the
`ld_imm64 rX, map` instructions (src_reg BPF_PSEUDO_MAP_FD). So on a miss we compile as before and
save, per function, its instruction bytes and the program type it is loaded with, and per map its
type, sizes, flags, BCC's JSON key/leaf type descriptions and the fd it had. On a hit we create
the maps again, rewrite each map fd in the instructions to the new one, and hand back a `bcc.BPF`
subclass without a libbcc module: its programs are loaded from the cached bytes (bcc_prog_load,
the same call BCC makes, less the program's BTF), its tables are BCC's own table classes on the new
map fds, and every attach/detach/cleanup method is BCC's, unchanged. (libbcc's accessors answer
-1/0 for a NULL module, bcc_common.cc; only the tables' key_sprintf/leaf_sscanf string helpers need
a real module, and the collector does not use them.)

The key is a sha256 of everything the bytes depend on: the source text, the cflags, the kernel
(release and version), BCC's version and the libbcc file. One file per key, JSON, written
atomically with mode 0600 under $XDG_CACHE_HOME/ingero-mcp/bpf (~/.cache/ingero-mcp/bpf). Anything
wrong with a cache file (unreadable, corrupt, another key, a map the kernel refuses, a program the
verifier refuses) means: compile as without a cache, and overwrite the file.
"""

from __future__ import annotations

import base64
import ctypes as ct
import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ingero_mcp.collector import uprobelink

FORMAT = 1
KEEP_FILES = 16  # older cache files (other sources, kernels, BCC versions) are pruned beyond this many
_DEFAULT: Any = object()

PROG_KPROBE, PROG_TRACEPOINT, PROG_PERF_EVENT, PROG_RAW_TRACEPOINT = 2, 5, 7, 17
LD_IMM64 = 0x18
PSEUDO_MAP_FD, PSEUDO_MAP_VALUE = 1, 2
# map types whose BCC table class needs nothing from a libbcc module
MAP_HASH, MAP_ARRAY, MAP_PERCPU_HASH, MAP_PERCPU_ARRAY = 1, 2, 5, 6
MAP_STACK_TRACE, MAP_LRU_HASH, MAP_LRU_PERCPU_HASH, MAP_LPM_TRIE, MAP_RINGBUF = 7, 9, 10, 11, 27
_TABLE_CLASSES = {
    MAP_HASH: "HashTable", MAP_ARRAY: "Array", MAP_PERCPU_HASH: "PerCpuHash", MAP_PERCPU_ARRAY: "PerCpuArray",
    MAP_STACK_TRACE: "StackTrace", MAP_LRU_HASH: "LruHash", MAP_LRU_PERCPU_HASH: "LruPerCpuHash",
    MAP_LPM_TRIE: "LpmTrie", MAP_RINGBUF: "RingBuf",
}
_PERCPU = {MAP_PERCPU_HASH, MAP_PERCPU_ARRAY, MAP_LRU_PERCPU_HASH}


class CacheUnusable(Exception):
    """This program cannot be saved, or a saved one cannot be used; the message says why."""


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/ingero-mcp/bpf, else ~/.cache/ingero-mcp/bpf (root: root's home)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ingero-mcp" / "bpf"


def _declare(lib: Any) -> Any:
    """ctypes signatures of the libbcc functions BCC's libbcc.py leaves undeclared (idempotent)."""
    if getattr(lib, "_ingero_declared", False):
        return lib
    vp, sz = ct.c_void_p, ct.c_size_t
    for name, restype, argtypes in (
        ("bpf_num_tables", sz, [vp]),
        ("bpf_table_name", ct.c_char_p, [vp, sz]),
        ("bpf_table_fd_id", ct.c_int, [vp, sz]),
        ("bpf_table_type_id", ct.c_int, [vp, sz]),
        ("bpf_table_max_entries_id", sz, [vp, sz]),
        ("bpf_table_flags_id", ct.c_int, [vp, sz]),
        ("bpf_table_key_size_id", sz, [vp, sz]),
        ("bpf_table_leaf_size_id", sz, [vp, sz]),
        ("bpf_table_key_desc_id", ct.c_char_p, [vp, sz]),
        ("bpf_table_leaf_desc_id", ct.c_char_p, [vp, sz]),
        ("bpf_num_functions", sz, [vp]),
        ("bpf_function_name", ct.c_char_p, [vp, sz]),
        ("bpf_function_start", vp, [vp, ct.c_char_p]),
        ("bpf_function_size", sz, [vp, ct.c_char_p]),
        ("bpf_module_license", ct.c_char_p, [vp]),
        ("bpf_module_kern_version", ct.c_uint, [vp]),
        ("bcc_create_map", ct.c_int, [ct.c_int, ct.c_char_p, ct.c_int, ct.c_int, ct.c_int, ct.c_int]),
        ("bcc_prog_load", ct.c_int, [ct.c_int, ct.c_char_p, ct.c_void_p, ct.c_int, ct.c_char_p, ct.c_uint,
                                     ct.c_int, ct.c_char_p, ct.c_uint]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    lib._ingero_declared = True
    return lib


def _libbcc_identity() -> str:
    """Path, size and mtime of the libbcc this process mapped (what compiled, and what loads)."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
            if "/libbcc.so" in path:
                st = os.stat(path)
                return f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
    except OSError:
        pass
    return "libbcc:?"


def cache_key(bcc: Any, text: str, cflags: list[str]) -> str:
    """sha256 over what the compiled bytes depend on."""
    u = os.uname()
    h = hashlib.sha256()
    for part in (f"ingero-bpfcache {FORMAT}", text, "\0".join(cflags), u.release, u.version, u.machine,
                 str(getattr(bcc, "__version__", "?")), _libbcc_identity()):
        h.update(part.encode("utf-8", "surrogateescape"))
        h.update(b"\0\1\0")
    return h.hexdigest()


def _prog_type(name: str) -> int:
    if name.startswith("tracepoint__"):
        return PROG_TRACEPOINT
    if name.startswith("raw_tracepoint__"):
        return PROG_RAW_TRACEPOINT
    if name.startswith("perf_"):  # the on-CPU sampler (perf_sample): attach_perf_event loads it as PERF_EVENT
        return PROG_PERF_EVENT
    return PROG_KPROBE  # kprobes, uprobes, uretprobes


def _map_fd_slots(insns: bytes) -> list[tuple[int, int]]:
    """(byte offset of the imm, fd) of every ld_imm64 that refers to a map by fd."""
    out = []
    i, n = 0, len(insns) // 8
    while i < n:
        code, regs, _off, imm = struct.unpack_from("<BBhi", insns, i * 8)
        if code == LD_IMM64:
            src = regs >> 4
            if src in (PSEUDO_MAP_FD, PSEUDO_MAP_VALUE):
                out.append((i * 8 + 4, imm))
            elif src != 0:
                raise CacheUnusable(f"ld_imm64 with src_reg {src} (not a map fd)")
            i += 2  # the second half of a 16-byte instruction
        else:
            i += 1
    return out


def extract(bcc: Any, bpf: Any, key: str) -> dict[str, Any]:
    """What a compiled bcc.BPF holds that a later start needs: every function and every map."""
    lib = _declare(bcc.libbcc.lib)
    m = bpf.module
    maps = []
    for i in range(lib.bpf_num_tables(m)):
        mtype = lib.bpf_table_type_id(m, i)
        name = lib.bpf_table_name(m, i).decode()
        if mtype not in _TABLE_CLASSES:
            raise CacheUnusable(f"map {name} has type {mtype}, which the cache does not rebuild")
        key_desc, leaf_desc = lib.bpf_table_key_desc_id(m, i), lib.bpf_table_leaf_desc_id(m, i)
        maps.append({
            "name": name, "fd": lib.bpf_table_fd_id(m, i), "type": mtype,
            "key_size": lib.bpf_table_key_size_id(m, i), "leaf_size": lib.bpf_table_leaf_size_id(m, i),
            "max_entries": lib.bpf_table_max_entries_id(m, i), "flags": lib.bpf_table_flags_id(m, i),
            "key_desc": key_desc.decode() if key_desc else None, "leaf_desc": leaf_desc.decode() if leaf_desc else None,
        })
    fds = {mp["fd"] for mp in maps}
    funcs = []
    for i in range(lib.bpf_num_functions(m)):
        raw = lib.bpf_function_name(m, i)
        name = raw.decode()
        if name.split("__", 1)[0] in ("kfunc", "kretfunc", "lsm"):
            raise CacheUnusable(f"function {name} needs BTF attach info the cache does not keep")
        insns = ct.string_at(lib.bpf_function_start(m, raw), lib.bpf_function_size(m, raw))
        for _at, fd in _map_fd_slots(insns):
            if fd not in fds:
                raise CacheUnusable(f"function {name} refers to fd {fd}, not one of the module's maps")
        funcs.append({"name": name, "prog_type": _prog_type(name), "insns": base64.b64encode(insns).decode()})
    license_ = lib.bpf_module_license(m)
    return {"format": FORMAT, "key": key, "bcc": str(getattr(bcc, "__version__", "?")),
            "license": (license_ or b"GPL").decode(), "kern_version": lib.bpf_module_kern_version(m),
            "functions": funcs, "maps": maps}


def _write(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    files = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in files[KEEP_FILES:]:
        old.unlink(missing_ok=True)


def _trusted(path: Path) -> None:
    """The file and its directory belong to this user and no one else can write them: the bytes are
    loaded into the kernel as they are (the verifier keeps them safe, not from reading kernel memory)."""
    for p in (path.parent, path):
        st = os.stat(p)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise CacheUnusable(f"{p} is owned by uid {st.st_uid} or writable by others")


def _read(path: Path, key: str) -> dict[str, Any]:
    try:
        _trusted(path)
        entry = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CacheUnusable(f"unreadable: {type(exc).__name__}") from exc
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        raise CacheUnusable("not this program's entry")
    try:
        for fn in entry["functions"]:
            fn["insns"] = base64.b64decode(fn["insns"], validate=True)
            if not fn["insns"] or len(fn["insns"]) % 8:
                raise CacheUnusable(f"function {fn['name']}: {len(fn['insns'])} bytes")
        for mp in entry["maps"]:
            if mp["type"] not in _TABLE_CLASSES:
                raise CacheUnusable(f"map {mp['name']}: type {mp['type']}")
            int(mp["fd"]), int(mp["key_size"]), int(mp["leaf_size"]), int(mp["max_entries"]), int(mp["flags"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheUnusable(f"malformed: {type(exc).__name__} {exc}") from exc
    return entry


def _cached_class(bcc: Any) -> type:
    """A bcc.BPF subclass that runs from a cache entry instead of a libbcc module (module = None)."""
    made = getattr(bcc, "_IngeroCachedBPF", None)
    if made is not None:
        return made
    import atexit

    bcc_table = bcc.table
    lib = _declare(bcc.libbcc.lib)

    class CachedBPF(bcc.BPF):  # type: ignore[misc, name-defined]
        """bcc.BPF from cached bytes: maps created anew, programs loaded on demand, BCC's methods as they are."""

        def __init__(self, entry: dict[str, Any]) -> None:  # noqa: PLR0915 - mirrors BPF.__init__'s attributes
            # what BPF.__init__ sets before compiling (BCC 0.26)
            self.kprobe_fds, self.uprobe_fds, self.tracepoint_fds, self.raw_tracepoint_fds = {}, {}, {}, {}
            self.kfunc_entry_fds, self.kfunc_exit_fds, self.lsm_fds = {}, {}, {}
            self.perf_buffers, self.open_perf_events = {}, {}
            self._ringbuf_manager = None
            self.tracefile = None
            self.debug = 0
            self.funcs = {}
            self.tables = {}
            self.module = None
            self._entry = entry
            self._map_fds: list[int] = []
            self._maps: dict[str, tuple[int, dict[str, Any]]] = {}
            self._insns: dict[bytes, tuple[int, bytes]] = {}
            atexit.register(self.cleanup)
            try:
                remap: dict[int, int] = {}
                for i, mp in enumerate(entry["maps"]):
                    fd = lib.bcc_create_map(mp["type"], mp["name"].encode(), mp["key_size"], mp["leaf_size"],
                                            mp["max_entries"], mp["flags"])
                    if fd < 0:
                        raise CacheUnusable(f"creating map {mp['name']}: {os.strerror(ct.get_errno())}")
                    self._map_fds.append(fd)
                    remap[mp["fd"]] = fd
                    self._maps[mp["name"]] = (i, mp)
                for fn in entry["functions"]:
                    code = bytearray(fn["insns"])
                    for at, old in _map_fd_slots(code):
                        if old not in remap:
                            raise CacheUnusable(f"function {fn['name']} refers to unknown map fd {old}")
                        struct.pack_into("<i", code, at, remap[old])
                    self._insns[fn["name"].encode()] = (fn["prog_type"], bytes(code))
                self._trace_autoload()
            except Exception:
                self.cleanup()
                raise

        def load_func(self, func_name: Any, prog_type: int, device: Any = None, attach_type: int = -1) -> Any:
            func_name = func_name.encode() if isinstance(func_name, str) else bytes(func_name)
            if func_name in self.funcs:
                return self.funcs[func_name]
            if func_name not in self._insns:
                raise Exception(f"Unknown program {func_name.decode()}")
            _type, code = self._insns[func_name]
            if attach_type == uprobelink.BPF_TRACE_UPROBE_MULTI:  # bcc_prog_load cannot pass an attach type
                fd = uprobelink.prog_load(func_name, code, self._entry["license"].encode())
            else:
                buf = ct.create_string_buffer(code, len(code))
                fd = lib.bcc_prog_load(prog_type, func_name, buf, len(code), self._entry["license"].encode(),
                                       self._entry["kern_version"], 0, None, 0)
            if fd < 0:
                err = ct.get_errno()
                if err == 1:  # EPERM
                    raise Exception("Need super-user privileges to run")
                raise Exception(f"Failed to load BPF program {func_name.decode()}: {os.strerror(err)}")
            fn = bcc.BPF.Function(self, func_name, fd)
            self.funcs[func_name] = fn
            return fn

        def _trace_autoload(self) -> None:
            for name, (ptype, _code) in self._insns.items():
                if ptype == PROG_TRACEPOINT and name.startswith(b"tracepoint__"):
                    fn = self.load_func(name, bcc.BPF.TRACEPOINT)
                    self.attach_tracepoint(tp=fn.name[len(b"tracepoint__"):].replace(b"__", b":"), fn_name=fn.name)
                elif ptype == PROG_RAW_TRACEPOINT and name.startswith(b"raw_tracepoint__"):
                    fn = self.load_func(name, bcc.BPF.RAW_TRACEPOINT)
                    self.attach_raw_tracepoint(tp=fn.name[len(b"raw_tracepoint__"):], fn_name=fn.name)
                elif name.startswith(b"kprobe__"):
                    fn = self.load_func(name, bcc.BPF.KPROBE)
                    self.attach_kprobe(event=self.fix_syscall_fnname(name[8:]), fn_name=fn.name)
                elif name.startswith(b"kretprobe__"):
                    fn = self.load_func(name, bcc.BPF.KPROBE)
                    self.attach_kretprobe(event=self.fix_syscall_fnname(name[11:]), fn_name=fn.name)

        def get_table(self, name: Any, keytype: Any = None, leaftype: Any = None, reducer: Any = None) -> Any:
            key = name.decode() if isinstance(name, bytes) else name
            if key not in self._maps:
                raise KeyError(name)
            map_id, mp = self._maps[key]
            if keytype is None and mp["key_desc"]:
                keytype = bcc.BPF._decode_table_type(json.loads(mp["key_desc"]))
            if leaftype is None:
                leaftype = bcc.BPF._decode_table_type(json.loads(mp["leaf_desc"]))
            cls = getattr(bcc_table, _TABLE_CLASSES[mp["type"]])
            kwargs = {"reducer": reducer} if mp["type"] in _PERCPU else {}
            args = (self, map_id, self._map_fds[map_id], keytype, leaftype)
            t = cls(*args, key.encode(), **kwargs) if mp["type"] == MAP_RINGBUF else cls(*args, **kwargs)
            # TableBase asked a NULL module (libbcc answers -1/-1/0): set what the kernel map has
            t.ttype, t.flags, t.max_entries = mp["type"], mp["flags"], int(mp["max_entries"])
            return t

        def close(self) -> None:
            for name, fn in list(self.funcs.items()):
                os.close(fn.fd)
                del self.funcs[name]
            fds, self._map_fds = self._map_fds, []
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass

    bcc._IngeroCachedBPF = CachedBPF
    return CachedBPF


def load_bpf(bcc: Any, text: str, cflags: list[str], *, cache_dir: Path | None = _DEFAULT,
             say: Callable[[str], None] | None = None) -> tuple[Any, str]:
    """A loaded program (bcc.BPF, or its cached twin) and what happened: 'compiled', 'compiled, cached',
    'cache hit', or 'cache unusable (<why>): compiled[, cached]'. cache_dir None: no cache."""
    if cache_dir is _DEFAULT:
        try:
            cache_dir = default_cache_dir()
        except (RuntimeError, KeyError) as exc:  # no $HOME and no passwd entry
            if say is not None:
                say(f"eBPF program cache off: no home directory ({exc})")
            cache_dir = None
    if cache_dir is None:
        return bcc.BPF(text=text.encode(), cflags=cflags), "compiled"
    key = cache_key(bcc, text, cflags)
    path = Path(cache_dir) / f"{key}.json"
    why = None
    try:
        entry: dict[str, Any] | None = _read(path, key)
    except CacheUnusable as exc:
        entry = None
        if not isinstance(exc.__cause__, FileNotFoundError):  # no file yet: a plain miss
            why = str(exc)
    if entry is not None:
        try:
            return _cached_class(bcc)(entry), "cache hit"
        except Exception as exc:  # noqa: BLE001 - any failure of the cached path: compile as before
            why = str(exc) if type(exc) in (CacheUnusable, Exception) else f"{type(exc).__name__}: {exc}"
    bpf = bcc.BPF(text=text.encode(), cflags=cflags)
    status = "compiled" if why is None else f"cache unusable ({why}): compiled"
    try:
        _write(path, extract(bcc, bpf, key))
        status += ", cached"
    except (OSError, CacheUnusable) as exc:
        if say is not None:
            say(f"eBPF program not cached ({exc})")
    return bpf, status
