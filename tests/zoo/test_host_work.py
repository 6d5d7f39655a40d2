"""What a host-bound thread's own work was, read from its on-CPU samples (causes/culprits.host_work), on three recorded
natural jobs: a training loop run under torch.profiler left on, one keeping an EMA of its weights on the CPU, and one
saving its whole state with torch.save on the main thread every ~6 s."""

from __future__ import annotations

from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis.models import CausalChain
from ingero_mcp.store import open_store

NATURAL = REPO / "investigations" / "zoo-natural"
PROFILED, EMA, SAVES = "natural_profiler_left_on", "natural_ema_on_cpu", "natural_sync_torch_save_ckpt"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("host_work")
    decompressed(NATURAL, [PROFILED, EMA, SAVES], out)
    return out


def _share_recomputed(db: Path, chain: CausalChain, kind: str) -> None:
    """The chain's evidence of its samples' share in `kind` of code: 50% or more, recomputed by its SQL (the share
    shown is its first column, then framework_share_sql's)."""
    share = next(e for e in chain.evidence
                 if e.name.startswith(f"its on-CPU samples outside CUDA calls with a frame in {kind}"))
    con = open_store(db)
    try:
        got = con.execute(share.sql).fetchall()[0]
    finally:
        con.close()
    assert got[0] == share.value >= 50, (got, share.value)


def test_a_profiler_left_on_is_named_with_its_fix(stores: Path) -> None:
    """natural_profiler_left_on: 53% of the run in prof.step() (the job's clock), 73-77% of the main thread's samples
    under torch/profiler or torch/autograd/profiler: host-bound said of a profiler, with the profiler's fix (not the
    model's: fewer kernels would not help), its share recomputed by its evidence's SQL."""
    chain = _top(_report(stores, PROFILED))[0]
    assert chain.root_cause == "host-bound", chain.summary
    assert "in a profiler" in chain.summary, chain.summary
    assert "profiler left on" in chain.recommendations[0] and "CUDA graph" not in chain.recommendations[0]
    _share_recomputed(stores / f"{PROFILED}.duckdb", chain, "a profiler")


def test_math_on_cpu_tensors_is_told_from_the_copies_beside_it(stores: Path) -> None:
    """natural_ema_on_cpu: an EMA of the weights updated on the CPU (18.5% of the run) beside the copies to the host
    (65%, inside CUDA calls) and the step's own issuing (16%): its host-bound finding reads the samples outside CUDA
    calls, where most are in PyTorch's CPU kernels, and gets that fix (not the model's, not a profiler's)."""
    report = _report(stores, EMA)
    assert not any("profiler" in c.summary for c in report.chains), [c.summary for c in report.chains]
    host = next(c for c in _top(report) if c.root_cause == "host-bound")
    assert "samples outside CUDA calls in PyTorch's CPU kernels" in host.summary, host.summary
    assert "tensors kept on the CPU" in host.recommendations[0], host.recommendations
    # its code too is read outside its calls: the EMA's update, not the copies' function (68% of all its samples)
    assert host.frames is not None and "on-CPU samples outside CUDA calls" in host.frames.sentence
    assert " in ema_update (" in host.frames.sentence, host.frames.sentence


def test_a_checkpoint_saved_on_the_main_thread_is_one_story_led_by_its_serialising(stores: Path) -> None:
    """natural_sync_torch_save_ckpt: four saves (~1.9 s each, 37% of the run by the job's clocks: .cpu() copies,
    torch.save, os.replace) come back every ~6 s. One finding tells them (stalled 4 times, every 6 s), led by what
    most of it was, the thread serialising in torch.save (its samples in torch/serialization.py), with the IO it ends
    in and the copies said in the same stalls, and the fix to save off the thread (not the model's, not a read's)."""
    report = _report(stores, SAVES)
    top = _top(report)
    assert len(top) == 1, [(c.severity, c.root_cause, c.summary) for c in report.chains]
    chain = top[0]
    assert chain.root_cause == "host-bound" and "stalled 4 times" in chain.summary, chain.summary
    assert "serialising or deserialising data" in chain.summary and "(io-wait)" in chain.summary, chain.summary
    assert "save it from another thread or process" in chain.recommendations[0], chain.recommendations
    assert any("waiting for writes to reach the disk" in r for r in chain.recommendations), chain.recommendations
    assert not any("read the data ahead" in r.lower() for r in chain.recommendations), chain.recommendations
    assert chain.frames is not None and "torch/serialization.py" in chain.frames.sentence, chain.frames
    _share_recomputed(stores / f"{SAVES}.duckdb", chain, "serialisation code")
