"""Issue 21, "name the code": stacks read into top frames and folded stacks, and every finding naming its frames, over
small synthetic v6 stores with known stacks (tests/fixtures/stack_fixtures.py) and stores without any."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import duckdb
import pytest
from analysis_fixtures import check_evidence_sql
from paths import REPO
from stack_fixtures import PID, T0, S, checkpoint_store, host_bound_store, host_work_store, no_stacks_store

from ingero_mcp.analysis import TimeWindow, stacks_of
from ingero_mcp.analysis.report import build_report
from ingero_mcp.analysis.stacks import profile, recorded
from ingero_mcp.store import open_store
from ingero_mcp.store.views import lay_views

SLOW = TimeWindow(start_ns=T0 + 8 * S, end_ns=T0 + 16 * S)


def test_a_host_bound_thread_is_named_by_its_python_function(tmp_path: Path) -> None:
    """Four in five of the slow phase's samples are in default_collate under interpreter and libc frames: the frame
    of interest skips them, the caller is the Python caller, shares add up, the estimate says what it rests on."""
    con = open_store(host_bound_store(tmp_path / "host.duckdb"))
    p = profile(con, "on_cpu", PID, PID, SLOW, T0)
    top = p.top_frames[0]
    assert (top.frame.function, top.frame.file, top.frame.line) == (
        "default_collate", "torch/utils/data/_utils/collate.py", 123)
    assert top.frame.python and top.caller is not None and top.caller.function == "train_step"
    assert top.self_share == pytest.approx(0.8, abs=0.02) and top.inclusive_share == top.self_share
    assert sum(f.self_share for f in p.top_frames) == pytest.approx(1.0, abs=1e-3)
    train = next(f for f in p.top_frames if f.frame.function == "forward")
    assert train.caller and train.caller.function == "train_step"
    assert p.estimate and p.sample_hz == 97 and p.seconds == pytest.approx(p.count / 97, abs=0.01)
    assert p.coverage is not None and 0.9 <= p.coverage <= 1.1  # samples fell only where it ran
    assert p.why_none is None and p.stacks[0].folded.split(";")[p.stacks[0].leaf] == "default_collate"
    assert "memcpy" not in {f.frame.function for f in p.top_frames}  # libc under the Python frame is noise


def test_a_host_bound_finding_names_its_function_and_its_sql_recomputes_it(tmp_path: Path) -> None:
    db = host_bound_store(tmp_path / "host.duckdb")
    report = build_report(open_store(db))
    top = report.chains[0]
    assert top.root_cause == "host-bound" and top.frames is not None
    assert top.frames.part == "run_outside"
    assert "default_collate (torch/utils/data/_utils/collate.py:123), called from train_step (train.py:88)" in (
        top.frames.sentence)
    assert top.frames.sentence.startswith("80% of python3[700]'s "), top.frames.sentence  # named, not 'its'
    ev = next(e for e in top.evidence if "default_collate" in e.name)
    assert ev.value == pytest.approx(80.0, abs=1.5) and ev.unit == "%"
    fresh = open_store(db)
    lay_views(fresh)
    assert check_evidence_sql(fresh, [top]) >= 3
    share, count, seconds, covered = fresh.execute(ev.sql).fetchall()[0]
    # a finding of its running outside CUDA calls reads the samples taken there, against that time
    assert f"{count} on-CPU samples outside CUDA calls" in top.frames.sentence
    assert f"{float(seconds):.2f} s" in top.frames.sentence
    assert f"{covered:.0f}% of its running outside CUDA calls" in top.frames.sentence


def test_a_checkpoint_stall_names_write_checkpoint_and_the_kernels_fsync(tmp_path: Path) -> None:
    """The thread sleeps 40 ms a step in fsync under write_checkpoint: off-CPU, weighted by sleep time, the frame of
    interest is write_checkpoint, and in the kernel the first frame past the scheduler (the page wait of an fsync)."""
    db = checkpoint_store(tmp_path / "ckpt.duckdb")
    con = open_store(db)
    p = profile(con, "off_cpu", PID, PID, SLOW, T0)
    assert p.top_frames[0].frame.function == "write_checkpoint"
    assert p.top_frames[0].self_share == pytest.approx(40 / 45.5, abs=0.01)
    assert p.kernel_frames[0].frame.function == "folio_wait_bit_common"
    assert "do_fsync" in p.stacks[0].folded and p.stacks[0].kernel_from == 4
    assert p.seconds == pytest.approx(p.covered_of_s, rel=0.01)  # every sleep had a stack
    report = build_report(open_store(db))
    io = next(c for c in report.chains if c.root_cause == "io-wait")
    assert io.frames is not None and io.frames.profile.mode == "off_cpu"
    assert io.frames.profile.io and "blocked in write_checkpoint (ckpt.py:30)" in io.frames.sentence
    assert io.frames.sentence.startswith("100% of python3[700]'s 6.40 s asleep in IO with a stack (160 sleeps, 100% of "
                                         "its IO "), io.frames.sentence
    assert "in the kernel in folio_wait_bit_common" in io.frames.sentence
    fresh = open_store(db)
    lay_views(fresh)
    assert check_evidence_sql(fresh, [io]) >= 3


def test_a_store_without_stacks_says_why_and_its_findings_are_as_before(tmp_path: Path) -> None:
    """No stack_sources: the findings carry no frames and serialise without the field; asked directly, the profile
    says the collector took no stacks for the process, never a frame."""
    db = no_stacks_store(tmp_path / "none.duckdb")
    con = open_store(db)
    assert not recorded(con)
    report = build_report(con)
    assert report.chains and all(c.frames is None for c in report.chains)
    assert all("frames" not in c.model_dump(mode="json") for c in report.chains)
    res = stacks_of(con, PID, PID, SLOW, "both", t0=T0)
    assert res.on_cpu and res.on_cpu.top_frames == [] and res.on_cpu.count == 0
    assert res.on_cpu.why_none == f"the collector recorded no stack source for pid {PID}: stacks were not taken for it"
    assert res.off_cpu and res.off_cpu.stacks == [] and res.sources == []


def test_sampling_off_and_unwalkable_python_are_said_in_words(tmp_path: Path) -> None:
    db = host_bound_store(tmp_path / "off.duckdb", sources={"sample_hz": 0, "python_frames": False,
                                                            "frame_pointers": False})
    raw = duckdb.connect(str(db))
    raw.execute("DELETE FROM stack_samples")
    raw.close()
    con = open_store(db)
    p = profile(con, "on_cpu", PID, PID, SLOW, T0)
    assert p.top_frames == [] and p.why_none is not None
    assert "on-CPU sampling was off (sample_hz 0)" in p.why_none
    assert "a CPython 3.12 process whose Python frames could not be walked" in p.why_none
    assert "no frame pointers" in p.why_none


def test_a_store_recorded_before_v6_says_so(tmp_path: Path) -> None:
    """A zoo store (schema v5): no samples, and no user stacks; its kernel stacks at switch-outs still read."""
    src = REPO / "investigations" / "zoo-v5" / "affinity_narrowed.duckdb.xz"
    db = tmp_path / "v5.duckdb"
    with lzma.open(src) as f, db.open("wb") as out:
        shutil.copyfileobj(f, out)
    con = open_store(db)
    pid, tid, lo, hi = con.execute(
        "SELECT pid, tid, min(off_ns), max(off_ns) + 1 FROM sched_intervals WHERE kstack_id IS NOT NULL "
        "GROUP BY ALL ORDER BY count(*) DESC LIMIT 1").fetchall()[0]
    w = TimeWindow(start_ns=lo, end_ns=hi)
    on = profile(con, "on_cpu", pid, tid, w)
    assert on.why_none == "recorded before schema v6 (this store is v5): no on-CPU samples were taken"
    off = profile(con, "off_cpu", pid, tid, w)
    assert off.kernel_frames and off.top_frames[0].frame.function == off.kernel_frames[0].frame.function
    assert not recorded(con)  # the findings do not look for frames: the reports stay as they were


def test_a_gil_holding_pool_is_named_by_the_code_it_ran(tmp_path: Path) -> None:
    """The mechanisms' GIL store (three py_task threads hold the GIL in turn while the main thread waits for it),
    with on-CPU samples of the pool in tokenize (data.py:12) where they ran: the chain's culprits' code names it,
    and the main thread's own sleeps name the kernel's futex wait."""
    from test_analysis_mechanisms import PID as GIL_PID
    from test_analysis_mechanisms import T0 as GIL_T0
    from test_analysis_mechanisms import gil_pool_store

    db = gil_pool_store(tmp_path / "gil.duckdb")
    raw = duckdb.connect(str(db))
    sid = raw.execute("SELECT min(session_id) FROM sessions").fetchall()[0][0]
    raw.execute("INSERT INTO stacks (session_id, stack_id, kind, frames, modules, files, lines) VALUES "
                "(?, 31, 'python', ['_PyEval_EvalFrameDefault', 'tokenize', 'worker_loop'], "
                "['libpython3.12.so.1.0', NULL, NULL], [NULL, 'data.py', 'data.py'], [NULL, 12, 3])", [sid])
    raw.execute("INSERT INTO stack_sources VALUES (?, ?, '3.12', TRUE, TRUE, 97, NULL)", [sid, GIL_PID])
    raw.execute(f"""INSERT INTO stack_samples SELECT {sid}, g.t, {GIL_PID}, p.tid, 6, NULL, 31
                    FROM range({GIL_T0 + 8 * S}, {GIL_T0 + 16 * S}, {S // 97}) g(t), (VALUES (611), (612), (613)) p(tid)
                    WHERE NOT EXISTS (SELECT 1 FROM sched_intervals i WHERE i.tid = p.tid AND g.t >= i.off_ns
                                      AND g.t < i.on_ns)""")
    raw.close()
    report = build_report(open_store(db))
    top = next(c for c in report.chains if c.root_cause == "gil-or-lock")
    assert top.frames is not None and top.frames.culprits
    pool = top.frames.culprits[0]
    assert pool.tids == [611, 612, 613] and pool.top_frames[0].frame.function == "tokenize"
    assert pool.top_frames[0].self_share == 1.0 and pool.top_frames[0].caller.function == "worker_loop"
    assert "and 2 more of its threads's" not in top.frames.sentence
    assert "100% of" in top.frames.sentence and "in tokenize (data.py:12), called from worker_loop" in (
        top.frames.sentence)
    own = top.frames.profile
    assert own.mode == "off_cpu" and own.top_frames[0].frame.function == "futex_wait_queue"
    fresh = open_store(db)
    lay_views(fresh)
    assert check_evidence_sql(fresh, [top]) >= 3


TORCH = "/usr/lib/python3/site-packages/torch"
HOST_WORK = {  # what the slow phase's samples ran -> what the host-bound finding says of it, and its fix's words
    "torch.compile recompiling": ([("_compile", None, f"{TORCH}/_dynamo/convert_frame.py", 700),
                                   ("__call__", None, f"{TORCH}/_dynamo/eval_frame.py", 500),
                                   ("train_step", None, "train.py", 88)],
                                  "compiling GPU code at run time", "Keep shapes few"),
    "torch.save on the thread": ([("persistent_id", None, f"{TORCH}/serialization.py", 1100),
                                  ("save", None, f"{TORCH}/serialization.py", 945),
                                  ("save_checkpoint", None, "train.py", 60)],
                                 "serialising or deserialising data", "save it from another thread or process"),
    "a compiled model's own running": ([("call", None, "/tmp/torchinductor_root/ab/cabc.py", 40),
                                        ("_fn", None, f"{TORCH}/_dynamo/eval_frame.py", 600),
                                        ("forward", None, f"{TORCH}/nn/modules/module.py", 1700),
                                        ("train_step", None, "train.py", 88)],
                                       "in PyTorch's own code (the model's layers", "fused ops (torch.compile)"),
}


@pytest.mark.parametrize("name", sorted(HOST_WORK))
def test_the_kind_of_host_work_is_read_from_the_files_its_samples_ran(tmp_path: Path, name: str) -> None:
    """A compile (Dynamo converting a frame: only on a cache miss) is not the model's own running, which passes
    through Dynamo's eval_frame on every call of compiled code; a torch.save is neither: each gets its own words and
    fix, the share recomputed by its evidence's SQL."""
    frames, said, fix = HOST_WORK[name]
    db = host_work_store(tmp_path / "work.duckdb", frames)
    chain = next(c for c in build_report(open_store(db)).chains if c.root_cause == "host-bound")
    assert said in chain.summary, chain.summary
    assert fix in chain.recommendations[0], chain.recommendations
    fresh = open_store(db)
    lay_views(fresh)
    assert check_evidence_sql(fresh, [chain]) >= 3
