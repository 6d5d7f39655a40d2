"""The code named on real GPU jobs (issue 21): scenarios recorded on the H200 with the v6 collector (user stacks,
on-CPU samples, Python frames walked from CPython 3.12's own state), and the seed benchmark re-recorded.

These stores were recorded after the stack analysis was written, against synthetic stores only, and were not used
to shape it; one change followed them (a culprit's frames need 10 on-CPU samples: the seed benchmark's 3 samples of a
worker's feeder thread were said as 356% of its on-CPU time). Each report must still name the staged cause, and its
finding must name the function the scenario's source does the work in.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, _top, check_verdict, decompressed

from ingero_mcp.analysis.models import CausalChain
from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store

ZOO_V6 = REPO / "investigations" / "zoo-v6"
V6_NAMES = sorted(p.name.removesuffix(".truth.json") for p in ZOO_V6.glob("*.truth.json"))
SEED = REPO / "investigations" / "h200-seed-benchmark-stacks.duckdb"

# The function each scenario's feeding thread (or its culprit) does the staged work in (bench/gpu/zoo/<name>.py),
# and whether it is the culprit's (a GIL holder) or the feeding thread's own frame.
NAMED = {"host_bound_prep": ("build_batch", "own"), "checkpoint_fsync": ("save_checkpoint", "own"),
         "gil_holder": ("spin", "culprit")}


@pytest.fixture(scope="module")
def v6_stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(ZOO_V6, V6_NAMES, tmp_path_factory.mktemp("zoo-v6"))


def _first(chain: CausalChain, whose: str) -> str:
    assert chain.frames is not None, f"no frames on {chain.root_cause}: {chain.summary}"
    profiles = [chain.frames.profile] if whose == "own" else chain.frames.culprits or [chain.frames.profile]
    top = [p.top_frames[0].frame for p in profiles if p.top_frames]
    assert top, chain.frames.sentence
    return top[0].function


def test_the_v6_zoo_holds_what_issue_21_names() -> None:
    assert V6_NAMES == sorted(NAMED)


@pytest.mark.parametrize("name", V6_NAMES)
def test_the_v6_report_names_the_cause_and_its_code(v6_stores: Path, name: str) -> None:
    report = _report(v6_stores, name)
    truth = json.loads((ZOO_V6 / f"{name}.truth.json").read_text())
    check_verdict(report, truth)
    chain = _top(report)[0]
    function, whose = NAMED[name]
    assert _first(chain, whose) == function, chain.frames.sentence if chain.frames else chain.summary
    frame = (chain.frames.profile if whose == "own" else chain.frames.culprits[0]).top_frames[0].frame
    assert frame.python and frame.file and frame.file.endswith(f"bench/gpu/zoo/{name}.py") and frame.line
    assert function in chain.frames.sentence and any(function in (e.value if isinstance(e.value, str) else e.name)
                                                     for e in chain.evidence)
    if name == "checkpoint_fsync":  # where it blocked in the kernel too
        assert chain.frames.profile.kernel_frames, chain.frames.sentence
        assert "in the kernel in" in chain.frames.sentence


def test_the_seed_benchmark_names_the_dataloader_fetch() -> None:
    """The bundled benchmark re-recorded with stacks: the host-bound finding names the function that built the
    batches, DataLoader's per-sample fetch (torch/utils/data/_utils/fetch.py), called from the iterator."""
    con = open_store(SEED)
    try:
        report = build_report(con)
    finally:
        con.close()
    chain = _top(report)[0]
    assert chain.root_cause == "host-bound"
    top = chain.frames.profile.top_frames[0] if chain.frames else None
    assert top is not None and top.frame.function == "_MapDatasetFetcher.fetch"
    assert top.frame.file and top.frame.file.endswith("torch/utils/data/_utils/fetch.py")
    assert top.self_share >= 0.5
    for c in report.chains:  # no culprit's code said from a handful of samples
        for p in c.frames.culprits if c.frames else []:
            assert p.mode != "on_cpu" or p.count >= 10, c.frames.sentence
