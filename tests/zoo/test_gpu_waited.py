"""Who waited on whom, from the syncs: where the feeding thread's synchronising calls returned at once, the GPU had
finished whatever was queued each time the host asked, so its idle time was the host's. Two natural jobs below a
GPU-bound average with no cause singled out (an LM whose step is issued from two threads on two CPUs, a GPT whose
step is issued from Python) said "nothing slowed the feeding threads" or "a launch-bound loop is not ruled out";
their syncs took 0.3% and 2.1% of the thread's time. A pair of gloo ranks whose syncs spin while the GPU works is
the control: there the host waited for the GPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, decompressed

from ingero_mcp.analysis.causes import pace_threads
from ingero_mcp.analysis.report import feeder_syncs_sql
from ingero_mcp.analysis.verdict import SYNC_WAIT_SHARE
from ingero_mcp.store import open_store

NATURAL, V5 = REPO / "investigations" / "zoo-natural", REPO / "investigations" / "zoo-v5"
LM, GPT, GLOO = "natural_lm_loader", "natural_gc_token_corpus", "healthy_gloo_pair"
SAID = "The GPU waited for the host, not the host for the GPU"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu_waited")
    decompressed(NATURAL, [LM, GPT], out)
    decompressed(V5, [GLOO], out)
    return out


@pytest.mark.parametrize("name", [LM, GPT])
def test_syncs_that_return_at_once_say_the_gpu_waited_for_the_host(stores: Path, name: str) -> None:
    """The line is said with numbers the store recomputes (the pace thread's syncs in call_spans), and no HIGH or
    MEDIUM cause beside it."""
    report = _report(stores, name)
    line = next((v for v in report.verdict if v.startswith(SAID)), None)
    assert line is not None, report.verdict
    assert not [c for c in report.chains if c.origin == "ingero-mcp" and c.severity in ("HIGH", "MEDIUM")]
    lead = pace_threads(report.accounting)[0]
    con = open_store(stores / f"{name}.duckdb")
    try:
        calls, ns, _ = con.execute(feeder_syncs_sql(lead.pid, lead.tid, None)).fetchall()[0]
    finally:
        con.close()
    assert f"{calls:,} synchronising calls" in line, (calls, line)
    share = float(re.search(r"in all, ([0-9.]+)% of its time", line).group(1))
    assert abs(share - 100 * ns / lead.busy_ns) < 0.06, (share, ns, lead.busy_ns)
    busy = float(re.search(r"GPU: ([0-9]+)% busy on average", line).group(1))
    assert ns <= SYNC_WAIT_SHARE * (1 - busy / 100) * lead.busy_ns, (ns, busy, lead.busy_ns)  # the GPU idle far longer


def test_the_jobs_own_clock_agrees_the_syncs_were_short(stores: Path) -> None:
    """natural_gc_token_corpus timed its own .item() (item_s) and the issuing of each step (issue_s): the syncs the
    line counts took what the job's clock says its .item() took (within 0.15 s of 20 s), and the issuing, on the host,
    was most of the run."""
    own = json.loads((NATURAL / f"{GPT}.truth.json").read_text())["self"]
    report = _report(stores, GPT)
    line = next(v for v in report.verdict if v.startswith(SAID))
    said_s = float(re.search(r"median [0-9.]+ [un]?s, ([0-9.]+) ms in all", line).group(1)) / 1e3
    assert abs(said_s - own["item_s"]) <= 0.15, (said_s, own["item_s"])
    assert own["issue_share"] > 0.5, own


def test_syncs_that_wait_for_the_gpu_do_not_say_it(stores: Path) -> None:
    """healthy_gloo_pair: GPU 76% busy, its rank's syncs spin on a CPU most of its time (57% on the CPU in CUDA
    calls): the host waited for the GPU, so the line is not said."""
    report = _report(stores, GLOO)
    assert not any(v.startswith(SAID) for v in report.verdict), report.verdict
