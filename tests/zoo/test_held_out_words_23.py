"""What the held-out group natural23 showed a report saying wrong, fixed after its one score, and what reading every
store's report after that fix showed of the same kind (the work of a drained-gap finding): each on the store that showed
it, the shares recomputed by SQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.causes.culprits import HOST_WORK_SAMPLES, HOST_WORK_SHARE
from ingero_mcp.analysis.drained import drained_gaps_sql
from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.analysis.stacks import FRAMEWORK_FILES, framework_share_sql, weights_sql
from ingero_mcp.store import open_store
from ingero_mcp.store.views import lay_views

TRIPLET, PUSH = "natural_triplet_mining_cpu", "natural_http_metrics_push"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [TRIPLET, PUSH], tmp_path_factory.mktemp("held_out_words_23"))


def test_a_programs_own_python_under_a_modules_forward_is_not_said_as_issuing_kernels(stores: Path) -> None:
    """Online triplet mining: the loss module's forward calls a selector that loops over anchor-positive pairs in
    Python with numpy and torch CPU ops. Nearly every sample holds a PyTorch frame (the Module's call), so it was said
    as PyTorch's own code issuing kernels, with the fix for many small kernels. The thread was issuing GPU work (its
    innermost Python frame PyTorch's, or a CUDA library on the stack) in under a third of them: its own code."""
    chain = next(c for c in _top(_report(stores, TRIPLET)) if c.root_cause == rc.HOST_BOUND)
    assert chain.severity == "HIGH", chain.severity
    assert "PyTorch's own code" not in chain.summary, chain.summary
    assert not any("small kernels" in r for r in chain.recommendations), chain.recommendations
    assert any("get_triplets" in f"{e.name} {e.value}" for e in chain.evidence), chain.evidence  # the code it ran
    con = open_store(stores / f"{TRIPLET}.duckdb")
    try:
        lay_views(con)
        lo, hi = con.execute("SELECT min(started_ns), max(stopped_ns) FROM sessions").fetchone()
        window = TimeWindow(start_ns=lo, end_ns=hi)
        issuing = con.execute(framework_share_sql(947, 947, window, "outside")).fetchall()[0][0]
        any_torch = con.execute(  # the old reading: any PyTorch frame on the stack
            f"SELECT 100 * sum(n) FILTER (WHERE len(list_filter(files, lambda f: {FRAMEWORK_FILES})) > 0) / sum(n) "
            f"FROM ({weights_sql('on_cpu', 947, 947, window, calls='outside')})").fetchall()[0][0]
    finally:
        con.close()
    assert issuing is not None and issuing < 50 < any_torch, (issuing, any_torch)
    _recomputed(stores, TRIPLET, [chain])


def test_a_drained_gap_findings_work_is_the_gaps_not_the_windows(stores: Path) -> None:
    """A metrics POST after every step left the GPU nothing queued 8% of the run. The finding in those gaps read its
    work from the gaps' samples, and where they named no kind of code it fell back to the window's: 64% in PyTorch's
    own code (the step's launches), with the small-kernels fix, for gaps that held the push. Where the gaps hold
    enough samples to be read, no one kind there is their answer: the window's kind is not said."""
    chain = next(c for c in _top(_report(stores, PUSH)) + _report(stores, PUSH).chains
                 if c.root_cause == rc.HOST_BOUND and "nothing of the process queued" in c.summary)
    assert "PyTorch's own code" not in chain.summary, chain.summary
    assert not any("small kernels" in r for r in chain.recommendations), chain.recommendations
    con = open_store(stores / f"{PUSH}.duckdb")
    try:
        lay_views(con)
        gaps = drained_gaps_sql(1444, 1444, chain.window.start_ns, chain.window.end_ns)
        in_gaps = con.execute(framework_share_sql(1444, 1444, chain.window, "outside", gaps)).fetchall()[0]
        window = con.execute(framework_share_sql(1444, 1444, chain.window, "outside")).fetchall()[0]
    finally:
        con.close()
    assert in_gaps[2] >= HOST_WORK_SAMPLES, in_gaps  # enough samples in the gaps to be read
    assert all(v is None or v < HOST_WORK_SHARE for i, v in enumerate(in_gaps) if i != 2), in_gaps
    assert window[0] >= HOST_WORK_SHARE, window  # what the fallback said: the window's kind
    _recomputed(stores, PUSH, [chain])
