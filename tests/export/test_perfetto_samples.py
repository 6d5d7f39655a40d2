"""Issue 21: the on-CPU stack samples of schema v6 reach the Perfetto timeline as callstack samples.

No collector writes samples yet, so the rows are written here through the real TraceWriter: three
stacks (a kernel stack, a native user stack with modules, files and lines, a Python stack whose
interpreter frames were replaced) and samples that show them alone, together, or none. The file is
read back as trace_processor reads it (`perfetto_decode`: interned callstacks, frames, mappings,
function names and source paths per sequence; the incremental clock) and each sample compared with
its row and its frames with the stacks' rows, outermost first.
"""

from __future__ import annotations

from pathlib import Path

from analysis_fixtures import MS, T0, contention_store
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto_decode import decode

from ingero_mcp.cli import main
from ingero_mcp.store import TraceWriter

KERNEL = {"stack_id": 1, "kind": "kernel", "frames": ["schedule", "futex_wait", "do_futex"],
          "modules": None, "files": None, "lines": None}
NATIVE = {"stack_id": 2, "kind": "user", "frames": ["cudaStreamSynchronize", "at::cuda::sync", "main"],
          "modules": ["/usr/lib/libcudart.so.12", "/opt/torch/lib/libtorch_cuda.so", None],
          "files": [None, "c10/cuda/CUDAStream.cpp", None], "lines": [None, 211, None]}
PYTHON = {"stack_id": 3, "kind": "python", "frames": ["__memcpy_avx", "collate", "train_step", "<module>"],
          "modules": ["/lib/x86_64-linux-gnu/libc.so.6", None, None, None],
          "files": [None, "torch/utils/data/_utils/collate.py", "train.py", "train.py"], "lines": [None, 120, 40, 1]}
STACKS = {s["stack_id"]: s for s in (KERNEL, NATIVE, PYTHON)}
# ts offset (ms), pid, tid, cpu, kstack_id, ustack_id
SAMPLES = [(1_000, 100, 100, 0, None, 2), (1_010, 100, 100, 1, 1, 2), (1_020, 100, 101, None, None, 3),
           (1_030, 100, 100, 0, 1, None), (1_040, 100, 101, 3, None, None), (1_050, 200, 200, 1, 1, 3)]


def _store(tmp_path: Path) -> Path:
    db = contention_store(tmp_path / "samples.duckdb")
    with TraceWriter(db, session_id=1) as w:
        w.append("stacks", {k: [s[k] for s in STACKS.values()] for k in KERNEL})
        w.append("stack_samples", {"ts_ns": [T0 + ms * MS for ms, *_ in SAMPLES], "pid": [r[1] for r in SAMPLES],
                                   "tid": [r[2] for r in SAMPLES], "cpu": [r[3] for r in SAMPLES],
                                   "kstack_id": [r[4] for r in SAMPLES], "ustack_id": [r[5] for r in SAMPLES]})
    return db


def _expected_frames(kstack: int | None, ustack: int | None) -> list[tuple] | None:
    """The frames a sample must show, outermost first: the user stack's, then the kernel's (written here from
    the rows above, not by the exporter's code)."""
    if kstack is None and ustack is None:
        return None
    out = []
    for sid in (ustack, kstack):
        if sid is None:
            continue
        s = STACKS[sid]
        for i in reversed(range(len(s["frames"]))):
            module = s["modules"][i] if s["modules"] else None
            file = s["files"][i] if s["files"] else None
            kind = {"kernel": pb.Frame.KIND_KERNEL, "user": pb.Frame.KIND_NATIVE}.get(s["kind"])
            if s["kind"] == "python":
                kind = pb.Frame.KIND_INTERPRETED if module is None else pb.Frame.KIND_NATIVE
            out.append((s["frames"][i], module, file, s["lines"][i] if s["lines"] else None, kind))
    return out


def test_samples_carry_their_stacks(tmp_path: Path) -> None:
    db = _store(tmp_path)
    out = tmp_path / "run.pftrace"
    assert main(["export", "--db", str(db), "-o", str(out)]) == 0
    got = decode(out)
    want = [{"ts": T0 + ms * MS, "pid": pid, "tid": tid, "cpu": cpu, "frames": _expected_frames(k, u)}
            for ms, pid, tid, cpu, k, u in SAMPLES]
    assert got.samples == want
    interpreted = [f for s in got.samples if s["frames"] for f in s["frames"] if f[4] == pb.Frame.KIND_INTERPRETED]
    assert {f[0] for f in interpreted} == {"collate", "train_step", "<module>"}
    threads = {d.thread.tid for d in got.tracks.values() if d.HasField("thread")}
    assert {100, 101} <= threads, "the sampled threads have their tracks"


def test_samples_follow_the_scope(tmp_path: Path) -> None:
    """--pid keeps that process's samples, and only the stacks they show are interned."""
    db = _store(tmp_path)
    out = tmp_path / "pid.pftrace"
    assert main(["export", "--db", str(db), "-o", str(out), "--pid", "200"]) == 0
    got = decode(out)
    assert [(s["pid"], s["tid"]) for s in got.samples] == [(200, 200)]
    assert got.samples[0]["frames"] == _expected_frames(1, 3)


def test_a_store_without_samples_has_none(tmp_path: Path) -> None:
    db = contention_store(tmp_path / "plain.duckdb")
    out = tmp_path / "plain.pftrace"
    assert main(["export", "--db", str(db), "-o", str(out)]) == 0
    got = decode(out)
    assert got.samples == [] and got.events
