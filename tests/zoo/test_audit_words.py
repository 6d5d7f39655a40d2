"""What a second audit of recorded natural jobs (helpers reading only the reports, the rows and the scripts) found the
reports saying that the jobs did not do: a pool's share said of one member, fixes for a DataLoader, a batch or a
thread pool the job did not have. Each on the store that showed it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.store import open_store

NATURAL = REPO / "investigations" / "zoo-natural"
SMI, OMP, DECODE = "natural_nvidia_smi_logger", "natural_omp_threads_oversubscribed", "natural_generate_decode"
RNN, METRICS = "natural_rnn_unrolled", "natural_cpu_eval_metrics"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [SMI, OMP, DECODE, RNN, METRICS], tmp_path_factory.mktemp("audit_words"))


@pytest.mark.parametrize("name", [SMI, OMP])
def test_a_pools_share_is_not_said_of_one_member(stores: Path, name: str) -> None:
    """175 nvidia-smi runs ended 61% of the sleep together (nvidia-smi[973] once, 0.048 s); seven OpenMP threads 92%
    (python3[1075/1102] 15%). The share is the pool's; the member walked from is said as one of them."""
    chain = _top(_report(stores, name))[0]
    assert "% of the sleep together)" in chain.summary, chain.summary
    assert "(the one of them read," in chain.summary, chain.summary
    said = chain.summary.count("% of the sleep") - chain.summary.count("% of the sleep with a stack")
    assert said == 1, chain.summary


def test_values_read_back_one_by_one_get_the_reads_fix(stores: Path) -> None:
    """Greedy decoding read each token back with .tolist(): 132 copies an iteration, nearly all device to host, no
    DataLoader. Said as results read back, with a fix that gathers them, not one that pins a DataLoader's batches."""
    chains = [c for c in _report(stores, DECODE).chains if c.root_cause == rc.HOST_BOUND and "read back" in c.summary]
    assert chains, [c.summary[:200] for c in _report(stores, DECODE).chains]
    fix = chains[0].recommendations[0]
    assert "values back to the host" in fix and "DataLoader" not in fix, fix


def test_the_autograd_thread_on_one_cpu_is_not_a_pool_to_cap(stores: Path) -> None:
    """An LSTM cell unrolled in Python on one CPU: the main thread and PyTorch's autograd thread waited 4.8 s each
    behind the other; no intra-op pool ran. The fix says the two take turns, not to cap intra-op threads."""
    chains = [c for c in _report(stores, RNN).chains if c.root_cause == rc.OWN_THREADS_CPU]
    assert chains, [c.root_cause for c in _report(stores, RNN).chains]
    fix = chains[0].recommendations[0]
    assert "autograd thread" in fix and "set_num_threads" not in fix, fix


def test_host_work_that_is_not_batch_preparation_is_not_said_so(stores: Path) -> None:
    """An evaluation's pure-Python metrics (roc_auc) on batches already on the GPU: the fix does not tell the job to
    move its batch preparation into DataLoader workers first."""
    chain = next(c for c in _top(_report(stores, METRICS)) if c.root_cause == rc.HOST_BOUND)
    assert "roc_auc" in " ".join(e.value for e in chain.evidence if isinstance(e.value, str)) or chain.frames
    assert not chain.recommendations[0].split(": ", 1)[-1].lower().startswith("move batch preparation"), \
        chain.recommendations[0]


def test_kernels_compiled_per_shape_do_not_hide_the_loops_sync(tmp_path: Path) -> None:
    """natural_variable_length_batches: a Transformer on batches of random length made 300 steps, one loss.item()
    each; scores of kernels compiled per length, a few launches each, used up the marker search before the sync was
    read, and the report said no call recurs once per iteration. The sync marks the steps: one per step in the run."""
    name = "natural_variable_length_batches"
    decompressed(NATURAL, [name], tmp_path)
    truth = json.loads((NATURAL / f"{name}.truth.json").read_text())
    report = _report(tmp_path, name)
    marker = next(m for m in report.accounting.progress if m.pid == truth["feeder"]["pid"])
    lo, hi = truth["baseline_ns"]
    con = open_store(tmp_path / f"{name}.duckdb")
    try:
        marks = con.execute(f"SELECT count(*) FROM ({marker.sql}) WHERE ts_ns BETWEEN ? AND ?", [lo, hi]).fetchall()
    finally:
        con.close()
    assert abs(marks[0][0] - truth["self"]["steps"]) <= 2, (marker.label, marks, truth["self"]["steps"])


def test_a_read_every_n_steps_is_said_to_span_n_steps(tmp_path: Path) -> None:
    """natural_gpu_dataset_fast read its loss back every 20 steps (truth `read_every`); its only sync marks those reads,
    and the report counted 116 iterations for 2,120 steps. Every launch recurs 20 times between two marks: the verdict
    says so beside the count. natural_lm_loader, whose marker is its step, is not said to hold several."""
    names = ["natural_gpu_dataset_fast", "natural_lm_loader"]
    decompressed(NATURAL, names, tmp_path)
    every = json.loads((NATURAL / f"{names[0]}.truth.json").read_text())["self"]["read_every"]
    said = _report(tmp_path, names[0]).verdict[0]
    assert f"every launch recurs {every} times between two of them" in said, said
    assert "every launch recurs" not in _report(tmp_path, names[1]).verdict[0]


def test_a_library_in_a_virtualenv_named_torch_is_not_pytorch(tmp_path: Path) -> None:
    """natural_png_snapshots_main_thread encoded a PNG with PIL on the main thread every ~1.4 s (4.98 s of 5.51 s in
    snapshots, by its clock). PIL lives in /opt/torch/.venv/.../site-packages/PIL: a path with '/torch/' in it, which
    made its frames PyTorch's own code and the fix "the cost of issuing the model's many small kernels". The host-bound
    finding names the encoder's code and gives no model fix."""
    name = "natural_png_snapshots_main_thread"
    decompressed(NATURAL, [name], tmp_path)
    chains = [c for c in _top(_report(tmp_path, name)) if c.root_cause == rc.HOST_BOUND]
    assert chains, [c.summary[:160] for c in _report(tmp_path, name).chains]
    for c in chains:
        assert "PyTorch's own code" not in c.summary, c.summary
        assert "many small kernels" not in c.recommendations[0], c.recommendations[0]
