"""Drained gaps (analysis/drained.py) on a recorded job whose host-side cost lay at a busy GPU:
natural_nvidia_smi_logger ran `nvidia-smi` with subprocess.run every 10 steps right after a `.item()` (21% of its
run, the GPU ~75% busy over each second), so each call left the GPU with nothing of the process queued. Held to the
job's own clocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, decompressed

from ingero_mcp.analysis.accounting import origin_ns
from ingero_mcp.analysis.drained import drained_parts
from ingero_mcp.store import open_store

NATURAL = REPO / "investigations" / "zoo-natural"
NAME = "natural_nvidia_smi_logger"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [NAME], tmp_path_factory.mktemp("drained"))


def test_the_drained_sleep_is_the_wait_for_the_subprocesses(store: Path) -> None:
    """Over the measured run, the main thread's sleep in drained gaps holds at least its own measured sleep inside the
    subprocess calls (schedstat) and no more than their wall time: the waits for nvidia-smi, nothing else much."""
    truth = json.loads((NATURAL / f"{NAME}.truth.json").read_text())
    own, pid, marks = truth["self"], truth["feeder"]["pid"], truth["marks_ns"]
    con = open_store(store / f"{NAME}.duckdb")
    try:
        parts = drained_parts(con, pid, pid, origin_ns(con) or 0, marks["baseline"], marks["end"])
    finally:
        con.close()
    slept = sum(p.get("sleep_outside", 0) for p in parts.values()) / 1e9
    gaps = sum(p.get("gap", 0) for p in parts.values()) / 1e9
    assert 0.9 * own["smi_sleep_s"] <= slept <= own["smi_s"] + 0.5, (slept, own["smi_sleep_s"], own["smi_s"])
    assert slept <= gaps, (slept, gaps)


def test_the_report_asserts_the_spawns_the_drained_sleep_was_spent_on(store: Path) -> None:
    """At a GPU over 50% busy the report weighs only the drained time, and asserts its cause where the culprits its
    explainer named ended most of the sleep inside the drained gaps themselves: spawning-processes naming nvidia-smi,
    MEDIUM (21% of the run), near the calls' wall time, with the agreement as evidence; nothing HIGH."""
    truth = json.loads((NATURAL / f"{NAME}.truth.json").read_text())
    report = _report(store, NAME)
    assert not [c for c in report.chains if c.severity == "HIGH"], [c.summary for c in report.chains]
    spawns = [c for c in report.chains if c.root_cause == "spawning-processes"]
    assert spawns and spawns[0].severity == "MEDIUM", [(c.severity, c.root_cause) for c in report.chains]
    assert any(k.comm == "nvidia-smi" for k in spawns[0].culprits), spawns[0].culprits
    assert 0.5 * truth["self"]["smi_s"] <= (spawns[0].seconds_lost or 0) <= 1.5 * truth["self"]["smi_s"]
    agreed = [e for e in spawns[0].evidence if e.name.startswith("sleep inside the drained gaps ended by")]
    assert agreed, [e.name for e in spawns[0].evidence]
    ended, total = (float(x) for x in str(agreed[0].value).split(" of "))
    assert total > 0 and ended >= 0.5 * total, agreed[0].value


def test_the_who_line_names_the_children_as_one(store: Path) -> None:
    """The one-screen report names the 175 nvidia-smi children as one culprit with their summed time, not the
    autograd thread whose single share is larger than any one child's."""
    from ingero_mcp.render.summary import culprits_text

    spawns = [c for c in _report(store, NAME).chains if c.root_cause == "spawning-processes"]
    text = culprits_text(spawns[0])
    assert text.startswith("nvidia-smi[") and "child processes" in text, text
