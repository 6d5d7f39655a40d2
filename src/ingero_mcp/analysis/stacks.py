"""Where a thread ran and where it blocked, in its own code (issue 21, "name the code"): on-CPU samples and the
stacks taken at switch-outs into sleep (schemas/v6.sql), read into top frames and folded stacks.

On-CPU time is an estimate: each sample stands for 1/sample_hz s. Off-CPU time is exact: each interval with a stack
is weighted by its sleep time in the window. The frame of interest of a stack is its innermost frame past the
runtime's noise (the scheduler in the kernel; libc, the loader and the interpreter's C in native stacks; for
'python' stacks, the innermost Python function), and the same rule is written once in SQL (`leaf_sql`) so that a
share shown is the share its SQL gives. Where there are no stacks, `why_none` says why; a frame is never invented.
"""

from __future__ import annotations

import re
from collections import defaultdict

import duckdb

from ingero_mcp.analysis._sql import rows, sql_round, sql_str, tidy
from ingero_mcp.analysis.accounting import seconds_in
from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.analysis.stack_models import FoldedStack, Frame, FrameShare, StackProfile, StacksResult

# The runtime's noise, skipped when naming the frame of interest (a stack made only of noise keeps its leaf).
KERNEL_NOISE = (r"^(__schedule|schedule|schedule_[a-z_]+|io_schedule[a-z_]*|preempt_schedule[a-z_]*|"
                r"__wait_for_common|do_syscall_64|x64_sys_call|entry_SYSCALL_64[a-z_]*|__x64_sys_[a-z_0-9]+)"
                r"( \[.*\])?$")
MODULE_NOISE = r"(^|/)(libc[.-]|ld-linux|libpthread|libpython[0-9.]*\.so|python[0-9.]*$)"
FUNCTION_NOISE = r"^(_?Py[A-Z_][A-Za-z_]*|_PyEval_[A-Za-z_]+|__libc_[a-z_]+|_start|start_thread|clone3?|__clone3?)$"


def leaf_sql(s: str) -> str:
    """The 1-based index of a stack's frame of interest, over the `stacks` row aliased `s` (1: only noise)."""
    return tidy(f"""coalesce(list_position(list_transform(range(1, len({s}.frames) + 1), lambda i: CASE
        WHEN {s}.kind = 'kernel' THEN NOT regexp_matches({s}.frames[i], '{KERNEL_NOISE}')
        WHEN {s}.kind = 'python' THEN {s}.files[i] IS NOT NULL AND {s}.modules[i] IS NULL
        ELSE NOT (regexp_matches(coalesce({s}.modules[i], ''), '{MODULE_NOISE}')
                  OR regexp_matches({s}.frames[i], '{FUNCTION_NOISE}')) END), true), 1)""")


def _lo_hi(window: TimeWindow) -> tuple[int, int]:
    return int(window.start_ns), int(window.end_ns)


def _who(pid: int, tid: int | list[int] | None, col: str = "") -> str:
    """The rows of a process, of one of its threads, or of a group of its threads (a pool named as a culprit)."""
    p = f"{col}pid = {int(pid)}"
    if isinstance(tid, list):
        return f"{p} AND {col}tid IN ({', '.join(str(int(t)) for t in tid)})"
    return p if tid is None else f"{p} AND {col}tid = {int(tid)}"


CALLS = ("outside", "inside")  # a profile of the samples (sleeps) taken outside (inside) the thread's CUDA calls only


def _covered(mode: str, io: bool, calls: str | None = None) -> str:
    """The accounting's time the stacks stand for, over thread_seconds: on-CPU, asleep (each outside or inside CUDA
    calls: asleep outside them not in IO, the accounting's sleep_outside part), or asleep in IO."""
    if mode == "on_cpu":
        return {"outside": "run_outside_ns", "inside": "run_inside_ns"}.get(calls or "",
                                                                             "run_inside_ns + run_outside_ns")
    if io:
        return "sleep_io_ns"
    return {"outside": "sleep_outside_ns - sleep_io_ns", "inside": "sleep_inside_ns"}.get(
        calls or "", "sleep_inside_ns + sleep_outside_ns")


def _in_calls(calls: str | None, at: str, alias: str) -> str:
    """The condition that a sample (a sleep's switch-out) at `at` of the row `alias` lies outside / inside one of
    its thread's CUDA calls (call_spans), or none."""
    assert calls in (None, *CALLS), calls
    if calls is None:
        return ""
    return (f" AND {'NOT ' if calls == 'outside' else ''}EXISTS (SELECT 1 FROM call_spans c WHERE c.pid = {alias}.pid "
            f"AND c.tid = {alias}.tid AND c.start_ns <= {at} AND {at} < c.end_ns)")


def weights_sql(mode: str, pid: int, tid: int | list[int] | None, window: TimeWindow, io: bool = False,
                calls: str | None = None, within: str | None = None) -> str:
    """Per distinct (user stack, kernel stack): how many samples or intervals, the ns they stand for, and each
    stack's frames with the index of its frame of interest. on_cpu: samples, each 1e9 / sample_hz ns of its
    process's session; off_cpu: sleeps that began at a switch-out with a stack, clipped to the window (`calls`
    'outside' / 'inside': only the samples taken, the sleeps begun, outside / inside the thread's CUDA calls,
    call_spans; asleep outside them, not in IO; `within`: a query of intervals (a, b), only the samples in one of
    them, such as the drained gaps)."""
    lo, hi = _lo_hi(window)
    inside = f" AND EXISTS (SELECT 1 FROM ({within}) g WHERE g.a <= x.ts_ns AND x.ts_ns < g.b)" if within else ""
    if mode == "on_cpu":
        s = (f"SELECT x.session_id, x.ustack_id, x.kstack_id, count(*) AS n, "
             f"sum(1000000000 // nullif(src.sample_hz, 0))::BIGINT AS ns FROM stack_samples x "
             f"LEFT JOIN stack_sources src ON src.session_id = x.session_id AND src.pid = x.pid "
             f"WHERE {_who(pid, tid, 'x.')} AND x.ts_ns >= {lo} AND x.ts_ns < {hi}{_in_calls(calls, 'x.ts_ns', 'x')}"
             f"{inside} GROUP BY ALL")
    else:
        s = (f"SELECT session_id, ustack_id, kstack_id, count(*) AS n, "
             f"sum(least(off_ns + sleep_ns, {hi}) - greatest(off_ns, {lo}))::BIGINT AS ns FROM sched_intervals i "
             f"WHERE {_who(pid, tid)} AND sleep_ns > 0 AND off_ns < {hi} AND off_ns + sleep_ns > {lo} "
             + ("AND prev_state = 'uninterruptible' " if io else "")
             + ("AND prev_state IS DISTINCT FROM 'uninterruptible' " if calls == "outside" and not io else "")
             + _in_calls(calls, "i.off_ns", "i").strip() + (" " if calls else "")
             + "AND (ustack_id IS NOT NULL OR kstack_id IS NOT NULL) GROUP BY ALL")
    return (f"WITH s AS ({s}) SELECT s.n, s.ns, u.kind, u.frames, u.modules, u.files, u.lines, {leaf_sql('u')} AS "
            f"uleaf, k.frames AS kframes, k.modules AS kmodules, {leaf_sql('k')} AS kleaf FROM s "
            f"LEFT JOIN stacks u ON u.session_id = s.session_id AND u.stack_id = s.ustack_id "
            f"LEFT JOIN stacks k ON k.session_id = s.session_id AND k.stack_id = s.kstack_id "
            f"WHERE u.frames IS NOT NULL OR k.frames IS NOT NULL ORDER BY s.ns DESC, s.n DESC")


def self_share_sql(mode: str, pid: int, tid: int | list[int] | None, window: TimeWindow, frame: Frame, kernel: bool,
                   t0: int | None = None, io: bool = False, calls: str | None = None) -> str:
    """The numbers a profile's sentence shows: the share (%) of its weight whose frame of interest is `frame` (user,
    or kernel), the samples (intervals), the seconds they stand for and, given t0, the share (%) of the thread's
    on-CPU (sleep) time in the accounting that they cover (`calls`: samples and time outside / inside its CUDA
    calls)."""
    weight = "n" if mode == "on_cpu" else "ns"
    kern = f"kframes[kleaf] = {sql_str(_raw(frame))}"
    if kernel:
        hit = kern
    else:
        hit = (f"frames IS NOT NULL AND frames[uleaf] = {sql_str(frame.function)} AND files[uleaf] IS NOT DISTINCT "
               f"FROM {'NULL' if frame.file is None else sql_str(frame.file)} OR frames IS NULL AND {kern}")
    cover = "NULL"
    if t0 is not None:
        # at most all of it: samples at sample_hz estimate the time, and can come to a little more than it
        cover = (f"least(100, round(100 * sum(ns) / (SELECT sum({_covered(mode, io, calls)}) FROM thread_seconds "
                 f"WHERE {_who(pid, tid)} AND "
                 f"{seconds_in(window, t0)})))")
    return (f"SELECT round(100 * sum({weight}) FILTER (WHERE {hit}) / sum({weight}), 1) AS share_pct, "
            f"sum(n)::BIGINT AS count, round(sum(ns) / 1e9, 2) AS seconds, {cover} AS covered_pct "
            f"FROM ({weights_sql(mode, pid, tid, window, io, calls)})")


def _raw(frame: Frame) -> str:
    """A kernel frame as `stacks.frames` holds it ('function [module]' where v5 wrote it so)."""
    return frame.function if frame.file or not frame.module else f"{frame.function} [{frame.module}]"


_MOD = re.compile(r"^(.*?) \[([^\]]+)\]$")


def _frames(kind: str | None, frames: list, modules: list | None, files: list | None,
            lines: list | None) -> list[Frame]:
    """A stack's frames, innermost first; v5's 'function [module]' split where the modules column is NULL."""
    out = []
    for i, fn in enumerate(frames or []):
        mod = modules[i] if modules else None
        file = files[i] if files else None
        fn = str(fn)
        if mod is None and (m := _MOD.match(fn)):
            fn, mod = m.group(1), m.group(2)
        out.append(Frame(function=fn, module=mod, file=file, line=lines[i] if lines else None,
                         python=kind == "python" and mod is None and file is not None))
    return out


def _key(f: Frame) -> tuple:
    return (f.function, f.module, f.file, f.line)


def _caller(user: list[Frame], leaf: int) -> Frame | None:
    """The next frame outward from the frame of interest (a Python caller for a Python frame)."""
    for f in user[leaf + 1:]:
        if not user[leaf].python or f.python:
            return f
    return None


def profile(con: duckdb.DuckDBPyConnection, mode: str, pid: int, tid: int | list[int] | None, window: TimeWindow,
            t0: int | None = None, top: int = 10, top_stacks: int = 10, io: bool = False,
            calls: str | None = None) -> StackProfile:
    """A thread's (tid None: a process's) profile over the window: top frames (self and inclusive), the heaviest
    folded stacks, the time they cover against the accounting's (when `t0`, the trace's second 0, is given);
    `calls` 'outside' ('inside'): of its samples outside (inside) its CUDA calls, against its running there."""
    sql = weights_sql(mode, pid, tid, window, io, calls)
    got = rows(con, sql)
    prof = StackProfile(mode=mode, pid=pid, tid=None if isinstance(tid, list) else tid,  # type: ignore[arg-type]
                        tids=tid if isinstance(tid, list) else [], io=io, start_ns=window.start_ns,
                        end_ns=window.end_ns,
                        sql=sql, estimate=mode == "on_cpu")
    if mode == "on_cpu":
        hz = rows(con, f"SELECT max(sample_hz) FROM stack_sources WHERE pid = {int(pid)}")
        prof.sample_hz = int(hz[0][0]) if hz and hz[0][0] is not None else None
    total_ns = sum(int(r[1] or 0) for r in got)
    prof.count = sum(int(r[0]) for r in got)
    prof.seconds = round(total_ns / 1e9, 3)
    if t0 is not None:
        cov = rows(con, f"SELECT sum({_covered(mode, io, calls)}) FROM thread_seconds WHERE {_who(pid, tid)} "
                        f"AND {seconds_in(window, t0)}")
        if cov and cov[0][0] is not None:
            prof.covered_of_s = round(int(cov[0][0]) / 1e9, 3)
            prof.coverage = min(1.0, round(total_ns / int(cov[0][0]), 3)) if cov[0][0] else None
    if not got or not total_ns:
        prof.why_none = why_none(con, mode, pid, window)
        return prof
    selfs: dict[tuple, list] = {}
    kself: dict[tuple, list] = {}
    incl: dict[tuple, list] = {}
    callers: dict[tuple, dict[tuple, list]] = defaultdict(dict)
    folded: dict[str, FoldedStack] = {}
    for n, ns, kind, frames, modules, files, lines, uleaf, kframes, kmodules, kleaf in got:
        user = _frames(kind, frames, modules, files, lines) if frames else []
        kern = _frames("kernel", kframes, kmodules, None, None) if kframes else []
        n, ns = int(n), int(ns or 0)
        if user:
            i = int(uleaf) - 1
            leaf = user[i]
            c = _caller(user, i)
            if c is not None:
                callers[_key(leaf)].setdefault(_key(c), [c, 0])[1] += ns
        else:
            i, leaf = int(kleaf) - 1, kern[int(kleaf) - 1]
        selfs.setdefault(_key(leaf), [leaf, 0])[1] += ns
        if kern:
            kl = kern[int(kleaf) - 1]
            kself.setdefault(_key(kl), [kl, 0])[1] += ns
        for f in {_key(f): f for f in user + kern}.values():
            incl.setdefault(_key(f), [f, 0])[1] += ns
        chain = list(reversed(user)) + list(reversed(kern))
        text = ";".join(f.function for f in chain)
        at = (len(user) - 1 - i) if user else len(user) + len(kern) - 1 - i
        fs = folded.get(text)
        if fs is None:
            folded[text] = FoldedStack(folded=text, frames=chain, kernel_from=len(user) if kern else None, leaf=at,
                                       seconds=0.0, share=0.0, count=0)
            fs = folded[text]
        fs.seconds += ns / 1e9
        fs.count += n
    prof.top_frames = _shares(selfs, incl, callers, total_ns, top)
    if mode == "off_cpu" or any(k for k in kself):
        prof.kernel_frames = _shares(kself, incl, {}, total_ns, top) if kself else []
    heavy = sorted(folded.values(), key=lambda s: (-s.seconds, s.folded))
    prof.stacks_total = len(heavy)
    for s in heavy:
        s.share, s.seconds = round(s.seconds * 1e9 / total_ns, 4), round(s.seconds, 4)
    prof.stacks = heavy[:top_stacks]
    return prof


def _shares(selfs: dict, incl: dict, callers: dict, total_ns: int, top: int) -> list[FrameShare]:
    """The top frames by self weight, with their inclusive weight and commonest caller."""
    out = []
    for key, (frame, ns) in sorted(selfs.items(), key=lambda kv: (-kv[1][1], kv[0][0]))[:top]:
        inc = incl.get(key, [frame, ns])[1]
        by = callers.get(key) or {}
        caller = max(by.values(), key=lambda cv: cv[1])[0] if by and max(v[1] for v in by.values()) else None
        out.append(FrameShare(frame=frame, self_s=round(ns / 1e9, 4), self_share=round(ns / total_ns, 4),
                              inclusive_s=round(inc / 1e9, 4), inclusive_share=round(inc / total_ns, 4),
                              caller=caller))
    return out


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The version the store was recorded at (an older store is shown in the current shape, but recorded less)."""
    return int(rows(con, "SELECT max(version) FROM schema_version")[0][0] or 0)


def why_none(con: duckdb.DuckDBPyConnection, mode: str, pid: int, window: TimeWindow) -> str:
    """Why a process has no stacks of this kind in the window, in words from the schema version and
    stack_sources."""
    version = schema_version(con)
    if version < 6:
        if mode == "on_cpu":
            return f"recorded before schema v6 (this store is v{version}): no on-CPU samples were taken"
        kernel = ("no kernel stack was recorded at its switch-outs in this window" if version == 5
                  else "no stacks at all (kernel stacks at switch-outs came with v5)")
        return f"recorded before schema v6 (this store is v{version}): no user stacks were taken; {kernel}"
    src = rows(con, f"SELECT python, python_frames, frame_pointers, sample_hz, note FROM stack_sources "
                    f"WHERE pid = {int(pid)} ORDER BY session_id DESC LIMIT 1")
    if not src:
        return f"the collector recorded no stack source for pid {int(pid)}: stacks were not taken for it"
    python, frames, fp, hz, note = src[0]
    why = []
    if mode == "on_cpu" and not hz:
        why.append("on-CPU sampling was off (sample_hz 0)")
    if python and not frames:
        why.append(f"a CPython {python} process whose Python frames could not be walked")
    elif not python and frames is False and mode == "on_cpu":
        pass
    if fp is False:
        why.append("its native code has no frame pointers (user stacks stop at the leaf)")
    if note:
        why.append(str(note))
    if not why:
        why.append("no samples of it fell in this window" if mode == "on_cpu"
                   else "none of its sleeps in this window began with a stack")
    return "; ".join(why)


def sources(con: duckdb.DuckDBPyConnection, pid: int) -> list[str]:
    """How a process's stacks were taken, one line per session (empty before v6)."""
    out = []
    for python, frames, fp, hz, note in rows(con, f"SELECT python, python_frames, frame_pointers, sample_hz, note "
                                                  f"FROM stack_sources WHERE pid = {int(pid)} ORDER BY session_id"):
        words = [f"CPython {python}" if python else "not CPython",
                 "Python frames merged" if frames else "no Python frames",
                 {True: "frame pointers", False: "no frame pointers", None: "frame pointers unknown"}[fp],
                 f"{hz} on-CPU samples/s" if hz else "on-CPU sampling off"]
        out.append(", ".join(words) + (f" ({note})" if note else ""))
    return out


def stacks_of(con: duckdb.DuckDBPyConnection, pid: int, tid: int | None, window: TimeWindow, mode: str = "both",
              top: int = 10, t0: int | None = None) -> StacksResult:
    """get_stacks: a thread's (or process's) on-CPU and/or off-CPU profile over the window."""
    res = StacksResult(pid=pid, tid=tid, start_ns=window.start_ns, end_ns=window.end_ns, sources=sources(con, pid))
    if mode in ("on_cpu", "both"):
        res.on_cpu = profile(con, "on_cpu", pid, tid, window, t0, top=top, top_stacks=top)
    if mode in ("off_cpu", "both"):
        res.off_cpu = profile(con, "off_cpu", pid, tid, window, t0, top=top, top_stacks=top)
    return res


# PyTorch's own Python (the model's modules, autograd, the optimiser), not its data loading: a thread running there
# between CUDA calls spends its host time on the model's code and its kernel launches, not on preparing batches. The
# package's own directory (an installed torch, or a source tree's), not any path with a 'torch' in it: a virtualenv at
# /opt/torch/.venv holds PIL and numpy too (natural_png_snapshots_main_thread's PNG encoding was said as the model's).
FRAMEWORK_FILES = ("(f LIKE '%-packages/torch/%' OR f LIKE '%/pytorch/torch/%') "
                   "AND f NOT LIKE '%/torch/utils/data/%'")
# A sample's innermost Python frame's file (NULL on a stack without one).
PY_LEAF = "list_filter(files, lambda f: f LIKE '%.py')[1]"
# A sample whose innermost Python frame is Python's standard library (not an installed package): the thread ran that
# library's code when sampled, whatever PyTorch frames lie above (natural_anomaly_mode_left_on: autograd's anomaly
# mode formatting a stack trace for every node, traceback.py under the model's forward, was said as the model's code).
STDLIB_LEAF = f"coalesce({PY_LEAF} LIKE '%/lib/python3%' AND {PY_LEAF} NOT LIKE '%-packages/%', false)"
# A stack in a CUDA library (the driver, the runtime, PyTorch's CUDA code): the thread was issuing GPU work.
CUDA_STACK = ("len(list_filter(modules, lambda m: m LIKE '%libcuda%' OR m LIKE '%libcudart%' OR "
              "m LIKE '%libtorch_cuda%')) > 0")
# Python that PyTorch generated or runs to launch compiled kernels: torch.compile's Inductor output (its cache folder,
# /tmp/torchinductor_<user> by default) and Triton's launchers.
GENERATED_FILES = "f LIKE '%/torchinductor_%' OR f LIKE '%-packages/triton/%'"
# The thread issuing the model's kernels: its innermost Python frame in PyTorch's own files (or code it generated), or
# a CUDA library on the stack, and not the standard library's code. Not any PyTorch frame on the stack: a program's
# own Python called from a Module's forward runs under torch/nn/modules (natural_triplet_mining_cpu's selector, a
# Python loop over pairs under the loss module's forward: 97% of its samples had a PyTorch frame, 28% were issuing GPU
# work).
FRAMEWORK = (f"(len(list_filter([{PY_LEAF}], lambda f: ({FRAMEWORK_FILES}) OR {GENERATED_FILES})) > 0 OR "
             f"{CUDA_STACK}) AND NOT {STDLIB_LEAF}")
# The CUDA runtime compilers (NVRTC, nvJitLink, the PTX compiler): a thread running there compiles GPU code as the
# job runs (a new shape or dtype, a fused or attention kernel built on first use), not launching what is built.
COMPILER_MODULES = "m LIKE '%libnvrtc%' OR m LIKE '%libnvJitLink%' OR m LIKE '%libnvptxcompiler%'"
# torch.compile compiling (a first call, or a recompile for a new shape): Dynamo's frame conversion and tracing (its
# C hook calls convert_frame only on a cache miss), Inductor's graph compile, Triton's compiler. Not eval_frame.py or
# Inductor's runtime wrappers, which every call of compiled code passes through.
COMPILER_FILES = ("f LIKE '%/torch/_dynamo/convert_frame.py' OR f LIKE '%/torch/_dynamo/symbolic_convert.py' OR "
                  "f LIKE '%/torch/_inductor/compile_fx.py' OR f LIKE '%/triton/compiler/%'")


# PyTorch's CPU kernels (ATen's loops over CPU tensors, its OpenMP pool) on a stack with no CUDA library: math on CPU
# tensors (an optimiser or metrics kept on the CPU), not the issuing of GPU kernels.
CPU_OPS = ("(len(list_filter(modules, lambda m: m LIKE '%libgomp%')) > 0 OR len(list_filter(frames, lambda f: "
           "f LIKE 'at::TensorIteratorBase::%' OR f LIKE '%at::internal::invoke_parallel%' OR f LIKE 'at::native::%'"
           f")) > 0) AND NOT {CUDA_STACK}")


# A profiler at work in the process: PyTorch's (torch.profiler and the autograd profiler's Python, which builds and
# writes its trace; Kineto) and CUPTI, NVIDIA's profiling interface, whose callbacks run inside the CUDA calls it
# records. Its frames are PyTorch's own files too: a thread running there is being profiled, not running the model.
PROFILER = ("(len(list_filter(files, lambda f: f LIKE '%/torch/profiler/%' OR f LIKE '%/torch/autograd/profiler%'))"
            " > 0 OR len(list_filter(modules, lambda m: m LIKE '%libcupti%' OR m LIKE '%libkineto%')) > 0)")


# Serialising or deserialising data (torch.save/torch.load, pickle, safetensors, numpy's save/load): a checkpoint or a
# cache written or read on the thread, which PyTorch's own files hold too but which issues no GPU kernel.
SERIALISING = ("len(list_filter(files, lambda f: f LIKE '%/torch/serialization.py' OR f LIKE '%/pickle.py' OR "
               "f LIKE '%/copyreg.py' OR f LIKE '%/safetensors/%' OR f LIKE '%/numpy/lib/format.py' OR "
               "f LIKE '%/numpy/lib/_format_impl.py' OR f LIKE '%/numpy/lib/%npyio%.py')) > 0")
# Decompressing data (zlib's inflate under zipfile or gzip, lzma, bz2, zstd, lz4): data stored compressed and inflated
# on the thread, every epoch again: natural_zlib_compressed_shards' workers spent 93% of their time in it.
DECOMPRESSING = ("(len(list_filter(modules, lambda m: m LIKE '%libz.so%' OR m LIKE '%libzstd%' OR m LIKE '%liblz4%' "
                 "OR m LIKE '%liblzma%' OR m LIKE '%libbz2%' OR m LIKE '%libdeflate%')) > 0 OR len(list_filter(files, "
                 "lambda f: f LIKE '%/zipfile/%' OR f LIKE '%/zipfile.py' OR f LIKE '%/gzip.py' OR f LIKE '%/lzma.py' "
                 "OR f LIKE '%/bz2.py' OR f LIKE '%/zstandard/%' OR f LIKE '%/lz4/%')) > 0)")
# Compressing data (zlib's deflate under PNG or gzip output, zstd's, lz4's, bzip2's compressors): the same libraries
# as decompressing, the other direction (natural_png_snapshots_main_thread's PNG encoding was deflate, not inflate).
COMPRESSING = ("len(list_filter(frames, lambda f: f LIKE 'deflate%' OR f LIKE 'ZSTD_compress%' OR f LIKE "
               "'LZ4_compress%' OR f LIKE 'BZ2_bzCompress%' OR f LIKE 'lzma_%encoder%' OR f LIKE 'ImagingZipEncode%' "
               "OR f LIKE 'zlib_compress%' OR f LIKE 'zlib_Compress_compress%')) > 0")
# PyTorch's data loading on the thread (a DataLoader iterated without workers: its fetch, its collate, the dataset's
# __getitem__ called from them): batches prepared where the GPU is fed.
LOADING = "len(list_filter(files, lambda f: f LIKE '%/torch/utils/data/%')) > 0"
# Of that, a DataLoader's sampler drawing the batches' indices (its iterator's _next_index, torch's sampler.py): run in
# the main process, on the thread that iterates the loader, whatever num_workers (natural_pk_sampler_label_scan,
# natural_weighted_sampler_epochs: the workers idle while it drew).
SAMPLING = ("len(list_filter(frames, lambda f: ends_with(f, '._next_index'))) > 0 OR "
            "len(list_filter(files, lambda f: f LIKE '%/torch/utils/data/sampler.py')) > 0")
# Talking to another process through multiprocessing (a Manager's proxies, a Queue, a Pipe: each access pickled, sent
# and answered), its innermost Python frame there: natural_manager_dict_counters' gaps between steps were 54% of it.
# The innermost only: a worker's whole stack sits on multiprocessing's process start.
IPC = "coalesce(files[uleaf] LIKE '%/multiprocessing/%', false)"
# Python importing modules (its import system's frames: finding, loading and compiling a module's code): a new
# process's start-up (a spawned DataLoader worker imports the program and its libraries again before its first batch),
# or a module first imported mid-run. natural_spawn_workers_each_epoch's new workers spent 60% of their time in it.
IMPORTING = "len(list_filter(files, lambda f: f LIKE '<frozen importlib._bootstrap%')) > 0"
# Turning tensors into text (str, repr, format, print: torch's _tensor_str, which reads a GPU tensor's values back to
# the host, a synchronisation each, and formats them in Python): natural_tensor_str_logging's logging formatter
# printed four GPU tensors a step, 77% of the main thread's samples.
TENSOR_TEXT = "len(list_filter(files, lambda f: f LIKE '%/torch/_tensor_str.py')) > 0"
# A library timing candidate kernels on the GPU before it picks one: cuDNN's benchmark mode (its frontend's
# time_sorted_plan, the find API's get_plans_from_find, the legacy cudnnFind* calls) runs each convolution's candidates
# at every input shape it has not seen, a synchronisation each (natural_cudnn_benchmark_multiscale: its two threads'
# samples under time_sorted_plan through a slow phase at a busy GPU).
AUTOTUNING = ("len(list_filter(frames, lambda f: contains(f, 'time_sorted_plan') OR contains(f, 'get_plans_from_find') "
              "OR starts_with(f, 'cudnnFind'))) > 0")
FRAMEWORK_COLUMNS = ("framework_pct", "compiler_pct", "samples", "cpu_ops_pct", "profiler_pct",
                     "serialising_pct", "decompressing_pct", "loading_pct", "importing_pct", "ipc_pct",
                     "compressing_pct", "tensor_text_pct")  # its columns


def framework_share_sql(pid: int, tid: int, window: TimeWindow, calls: str | None = None,
                        within: str | None = None) -> str:
    """The shares (%) of the thread's on-CPU samples in the window (`calls`: those outside / inside its CUDA calls)
    issuing the model's kernels (FRAMEWORK: its innermost Python frame PyTorch's own, or a CUDA library on the
    stack), in one of the CUDA runtime compilers or
    torch.compile's (COMPILER_MODULES, COMPILER_FILES), the samples, the share in PyTorch's CPU kernels (CPU_OPS),
    the share in a profiler (PROFILER), the share serialising data (SERIALISING), the share decompressing it
    (DECOMPRESSING), the share in PyTorch's data loading (LOADING), the share importing modules (IMPORTING) and the
    share talking to another process (IPC), the share compressing data (COMPRESSING) and the share turning tensors
    into text (TENSOR_TEXT); `within`: as weights_sql's."""
    return (f"SELECT round(100 * sum(n) FILTER (WHERE {FRAMEWORK}) / sum(n), 1) AS framework_pct, "
            f"round(100 * sum(n) FILTER (WHERE len(list_filter(modules, lambda m: {COMPILER_MODULES})) > 0 OR "
            f"len(list_filter(files, lambda f: {COMPILER_FILES})) > 0) / sum(n), 1) "
            f"AS compiler_pct, sum(n) AS samples, "
            f"round(100 * sum(n) FILTER (WHERE {CPU_OPS}) / sum(n), 1) AS cpu_ops_pct, "
            f"round(100 * sum(n) FILTER (WHERE {PROFILER}) / sum(n), 1) AS profiler_pct, "
            f"round(100 * sum(n) FILTER (WHERE {SERIALISING}) / sum(n), 1) AS serialising_pct, "
            f"round(100 * sum(n) FILTER (WHERE {DECOMPRESSING}) / sum(n), 1) AS decompressing_pct, "
            f"round(100 * sum(n) FILTER (WHERE {LOADING}) / sum(n), 1) AS loading_pct, "
            f"round(100 * sum(n) FILTER (WHERE {IMPORTING}) / sum(n), 1) AS importing_pct, "
            f"round(100 * sum(n) FILTER (WHERE {IPC}) / sum(n), 1) AS ipc_pct, "
            f"round(100 * sum(n) FILTER (WHERE {COMPRESSING}) / sum(n), 1) AS compressing_pct, "
            f"round(100 * sum(n) FILTER (WHERE {TENSOR_TEXT}) / sum(n), 1) AS tensor_text_pct "
            f"FROM ({weights_sql('on_cpu', pid, tid, window, calls=calls, within=within)})")


def sampling_share_sql(pid: int, tid: int, window: TimeWindow, calls: str | None = None,
                       within: str | None = None) -> str:
    """The share (%) of the thread's on-CPU samples in the window in a DataLoader's sampler (SAMPLING), and the
    samples; `calls` and `within` as framework_share_sql's."""
    return (f"SELECT round(100 * sum(n) FILTER (WHERE {SAMPLING}) / sum(n), 1) AS sampling_pct, sum(n) AS samples "
            f"FROM ({weights_sql('on_cpu', pid, tid, window, calls=calls, within=within)})")


def autotuning_share_sql(pid: int, window: TimeWindow) -> str:
    """The share (%) of a process's on-CPU samples in the window (all its threads) in a library's autotuning
    (AUTOTUNING), and the samples."""
    return (f"SELECT round(100 * sum(n) FILTER (WHERE {AUTOTUNING}) / sum(n), 1) AS autotuning_pct, sum(n) AS samples "
            f"FROM ({weights_sql('on_cpu', pid, None, window)})")


# CPython's GIL: a thread asks for it on a condition variable with a timeout (its 5 ms switch interval), so a GIL
# wait's stack holds pthread_cond_timedwait (take_gil where the interpreter's frames are kept). A threading.Lock is
# a semaphore wait, and Condition, Event, queue and futures waits run through the standard library's Python files.
GIL_WAIT_FRAMES = ("pthread_cond_timedwait", "take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread")
SIGNAL_WAIT_FILES = ("f LIKE '%/threading.py' OR f LIKE '%/queue.py' OR f LIKE '%/concurrent/futures/%' OR "
                     "f LIKE '%/multiprocessing/%'")


def lock_waits_sql(pid: int, tids: list[int], window: TimeWindow) -> str:
    """Where threads of a process slept with a stack in the window, outside the GIL's waits and the standard
    library's waits for a signal (its innermost Python frame in threading, queue, futures or multiprocessing): the
    Python function most of that sleep waited in (its file and line), its share (%) of all their stacked sleep, then
    the GIL's share and the signal waits' share. What is left waits on a lock of the program's own, taken in that
    function (natural_locked_sample_cache: a cache's lock held over zlib)."""
    gil = " OR ".join(f"list_contains(frames, '{f}')" for f in GIL_WAIT_FRAMES)
    signalled = SIGNAL_WAIT_FILES.replace("f LIKE", "files[uleaf] LIKE")  # the innermost Python frame's file
    return (f"WITH x AS (SELECT *, coalesce({gil}, false) AS gil, coalesce({signalled}, false) AS signalled "
            f"FROM ({weights_sql('off_cpu', pid, tids, window)})), "
            "t AS (SELECT sum(ns) AS ns, sum(ns) FILTER (WHERE gil) AS gil_ns, sum(ns) FILTER (WHERE signalled) AS "
            "signal_ns FROM x) SELECT round(100 * sum(x.ns) / any_value(t.ns), 1) AS pct, x.frames[x.uleaf] AS "
            "function, x.files[x.uleaf] AS file, x.lines[x.uleaf] AS line, round(100 * coalesce(any_value(t.gil_ns), "
            "0) / any_value(t.ns), 1) AS gil_pct, round(100 * coalesce(any_value(t.signal_ns), 0) / any_value(t.ns), "
            "1) AS signalled_pct FROM x, t WHERE NOT x.gil AND NOT x.signalled AND x.files[x.uleaf] IS NOT NULL "
            "GROUP BY ALL ORDER BY pct DESC, function LIMIT 1")


def recorded(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the collector recorded how it took stacks (v6 and later): the one cheap query a store without
    stacks pays before the findings look for their frames."""
    return bool(rows(con, "SELECT 1 FROM stack_sources LIMIT 1"))


def sentence(p: StackProfile, who: str = "its", calls: str | None = None) -> str:
    """The profile's top frame in words: '61% of its 412 on-CPU samples (~4.1 s) in f (file:line) called from g'
    (`calls`: a profile of the samples outside / inside its CUDA calls, said so)."""
    if not p.top_frames:
        return f"no {'on-CPU samples' if p.mode == 'on_cpu' else 'stacks at its sleeps'}: {p.why_none}"
    t = p.top_frames[0]
    called = f", called from {t.caller.label()}" if t.caller else ""
    if p.mode == "on_cpu":
        where = f" {calls} CUDA calls" if calls else ""
        what = (f"{100 * t.self_share:.0f}% of {who} {p.count} on-CPU sample{'s' if p.count != 1 else ''}{where} "
                f"(an estimate of {p.seconds:.2f} s at {p.sample_hz or '?'} Hz"
                + (f", {100 * p.coverage:.0f}% of its {'running' if calls else 'on-CPU time'}{where}"
                   if p.coverage is not None else "") + ")")
        return f"{what} in {t.frame.label()}{called}"
    io = "IO " if p.io else ""
    where = f" {calls} CUDA calls" if calls and not p.io else ""
    cov = f", {100 * p.coverage:.0f}% of its {io}sleep{where}" if p.coverage is not None else ""
    what = (f"{100 * t.self_share:.0f}% of {who} {p.seconds:.2f} s asleep{where} {'in IO ' if p.io else ''}with a "
            f"stack ({p.count} sleep{'s' if p.count != 1 else ''}{cov})")
    kern = f"; in the kernel in {p.kernel_frames[0].frame.label()}" if p.kernel_frames and not (
        p.kernel_frames[0].frame == t.frame) else ""
    return f"{what} blocked in {t.frame.label()}{called}{kern}"


def share_value(p: StackProfile) -> float:
    """The top frame's self share as its SQL rounds it (%)."""
    return sql_round(100 * p.top_frames[0].self_share, 1) if p.top_frames else 0.0
