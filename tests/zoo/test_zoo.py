"""The zoo: causes staged on a real H200 and recorded with the collector; the report must name each one.

Each `investigations/zoo/NAME.duckdb` comes with `NAME.truth.json`, written by the scenario itself
(bench/gpu/zoo/NAME.py): what it staged, when, and which processes or threads did it. For each
store the top HIGH/MEDIUM chain must name the staged cause, its culprit (pid/tid or name) and its
window (within a second at each end); the healthy controls must give nothing HIGH or MEDIUM.
"""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest
from paths import REPO

from ingero_mcp.analysis.models import CausalChain, Report
from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store

ZOO = REPO / "investigations" / "zoo"
NAMES = sorted(p.name.removesuffix(".truth.json") for p in ZOO.glob("*.truth.json"))
# The same scenarios recorded again with the collector's always-on defaults (one probe layer, launches entry-only,
# the overhead governor at 2 %): schema v4 stores whose launches have no duration.
ZOO_DEFAULT = ZOO.parent / "zoo-default"
DEFAULT_NAMES = sorted(p.name.removesuffix(".truth.json") for p in ZOO_DEFAULT.glob("*.truth.json"))
SECOND = 1_000_000_000

# The staged cause (truth vocabulary) -> the chain root causes that name it.
CAUSES = {
    "cpu_contention": {"cpu-contention"},
    "own_workers_cpu": {"own-workers-cpu"},
    "gpu_shared": {"gpu-shared"},
    "gil_contention": {"gil-or-lock"},
    "lock_contention": {"gil-or-lock"},
    "pageable_copies": {"pageable-copies"},
    "allocator_churn": {"allocator-churn"},
    "host_bound_prep": {"host-bound"},
    "lazy_module_loading": {"cold-start"},
    "disk_io": {"io-wait"},
    "page_faults": {"page-faults"},
    "launch_bound": {"launch-bound"},
    "slow_consumer": {"slow-consumer", "network-wait"},
    "cpu_throttled": {"cpu-throttled"},
    "network_wait": {"network-wait"},
    "input_bound": {"waiting-on-workers", "waiting-on-process", "waiting-on-thread", "spawning-processes"},
    "python_gc": {"host-bound"},  # a collection is the main thread's own Python work; the stores do not name gc
    "excess_sync": {"excess-sync"},
    "own_threads_cpu": {"own-threads-cpu"},
    "timed_sleep": {"timed-sleep"},
    # The sixth group's causes (held out: this mapping was written before any of them was recorded or read; after
    # its first score, spawning-processes, a cause added then, joined subprocess_wait and input_bound).
    "subprocess_wait": {"waiting-on-process", "spawning-processes"},  # a child the loop spawns and waits for
    "file_lock": {"gil-or-lock", "waiting-on-process"},  # a lock another process holds: the lock or its holder
    "stopped_by_signal": {"stopped-by-signal", "waiting-on-process"},  # stopped (T), continued by the sender
    "lock_held_over_io": {"io-wait", "waiting-on-thread", "gil-or-lock"},  # a lock whose holder waits on the disk
    # The seventh group's (held out in turn: written before any of its scenarios was recorded or read).
    "pinning_churn": {"allocator-churn", "driver-lock"},  # host memory page-locked and unlocked every step
    # The eighth group's (held out in turn: written before any of its scenarios was recorded or read).
    "straggler": {"network-wait", "waiting-on-process"},  # a collective waiting on a slow peer rank
    # The eleventh group's (held out in turn: written before any of its scenarios was recorded or read). A cgroup over
    # memory.high sleeps in the kernel's reclaim throttle: the report's IO sleep, where it must say memory is reclaimed
    # (tests/zoo/test_zoo_v9.py), or the page faults that allocate.
    "memory_throttled": {"io-wait", "page-faults"},
    # The twelfth group's (held out in turn: written before any of its scenarios was recorded or read). Signals sent
    # flat out run the target's handler on its main thread: its own running, where the sender must be the culprit.
    "signal_storm": {"host-bound", "waiting-on-process", "stopped-by-signal"},
    # The eighteenth group's (held out in turn: written before any of its scenarios was recorded or read). A lock in
    # shared memory (a futex) another process holds while it sleeps: the lock, or the process that holds it.
    "ipc_lock": {"gil-or-lock", "waiting-on-process"},
    # The twentieth group's (held out in turn: written before any of its scenarios was recorded or read). The GPU's own
    # work per step grew: the job got slower with nothing on the host to blame, so, as for a control, nothing may be.
    "gpu_bound": set(),
}
WEAK_RATIO = 1.3  # a staged cause that slowed the job less than this is weak: no other cause may be named for it


def _truth(name: str) -> dict:
    return json.loads((ZOO / f"{name}.truth.json").read_text())


def decompressed(folder: Path, names: list[str], out: Path) -> Path:
    """The stores of a zoo folder, decompressed into `out` (kept xz-compressed in git: ~0.4 MB each instead of ~2.5)."""
    for name in names:
        with lzma.open(folder / f"{name}.duckdb.xz") as src, (out / f"{name}.duckdb").open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's stores, decompressed."""
    return decompressed(ZOO, NAMES, tmp_path_factory.mktemp("zoo"))


def _report(stores: Path, name: str) -> Report:
    con = open_store(stores / f"{name}.duckdb")
    try:
        return build_report(con)
    finally:
        con.close()


def _top(report: Report) -> list[CausalChain]:
    return [c for c in report.chains if c.origin == "ingero-mcp" and c.severity in ("HIGH", "MEDIUM")]


def test_the_zoo_holds_the_staged_causes_and_two_controls() -> None:
    causes = {_truth(n)["cause"] for n in NAMES}
    assert len(NAMES) >= 10
    assert sum(_truth(n)["cause"] == "none" for n in NAMES) >= 2
    assert {"cpu_contention", "own_workers_cpu", "gpu_shared", "gil_contention", "pageable_copies",
            "allocator_churn", "host_bound_prep", "lazy_module_loading"} <= causes


@pytest.mark.parametrize("name", NAMES)
def test_the_report_names_the_staged_cause(stores: Path, name: str) -> None:
    check_verdict(_report(stores, name), _truth(name))


@pytest.fixture(scope="module")
def default_stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo recorded with the collector's defaults, decompressed."""
    return decompressed(ZOO_DEFAULT, DEFAULT_NAMES, tmp_path_factory.mktemp("zoo-default"))


def test_the_default_zoo_is_the_whole_zoo_recorded_with_entry_only_launches(default_stores: Path) -> None:
    assert DEFAULT_NAMES == NAMES
    con = open_store(default_stores / "cpu_hog.duckdb")
    try:
        assert con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] >= 4
        launches = con.execute("SELECT count(*), count(duration_ns) FROM cuda_calls "
                               "WHERE contains(op, 'aunch')").fetchall()[0]
        assert launches[0] > 1000 and launches[1] == 0  # every launch entry-only
        # one layer
        assert con.execute("SELECT count(*) FROM cuda_calls WHERE op = 'cudaLaunchKernel'").fetchall()[0][0] == 0
        assert con.execute("SELECT count(*) FROM probe_costs WHERE method LIKE 'calibrated%'").fetchall()[0][0] == 2
    finally:
        con.close()


@pytest.mark.parametrize("name", DEFAULT_NAMES)
def test_the_report_names_the_staged_cause_with_the_default_probes(default_stores: Path, name: str) -> None:
    """Recorded on the H200 with the always-on defaults: the same verdicts (lazy_loading's cold start is then sized
    by upper bounds, the gap from each first launch to the thread's next call, and says so)."""
    report = _report(default_stores, name)
    truth = json.loads((ZOO_DEFAULT / f"{name}.truth.json").read_text())
    check_verdict(report, truth)
    if truth["cause"] == "lazy_module_loading":
        assert all("up to" in c.summary and c.severity != "HIGH" for c in report.chains if c.root_cause == "cold-start")


# Recorded on the H200 with the v5 collector (kernel stacks, cgroup samples) and the always-on defaults: the 16
# scenarios the zoo grew by and 5 of the first 13 again. The split is fixed in split.json: development scenarios shaped
# the analysis, held-out ones were only scored when a change was done.
ZOO_V5 = ZOO.parent / "zoo-v5"
SPLIT = json.loads((ZOO_V5 / "split.json").read_text())
V5_NAMES = sorted(p.name.removesuffix(".truth.json") for p in ZOO_V5.glob("*.truth.json"))


@pytest.fixture(scope="module")
def v5_stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The v5 zoo's stores, decompressed."""
    return decompressed(ZOO_V5, V5_NAMES, tmp_path_factory.mktemp("zoo-v5"))


def test_the_v5_zoo_is_split_and_holds_every_new_cause() -> None:
    parts = [SPLIT["development"], SPLIT["held_out"], SPLIT["held_out_2"], SPLIT["held_out_3"], SPLIT["held_out_4"],
             SPLIT["held_out_5"], SPLIT["held_out_6"], SPLIT["held_out_7"]]
    assert sorted(sum(parts, [])) == V5_NAMES and len(set(sum(parts, []))) == len(V5_NAMES)
    causes = {json.loads((ZOO_V5 / f"{n}.truth.json").read_text())["cause"] for n in V5_NAMES}
    assert set(CAUSES) - {"lazy_module_loading", "page_faults", "allocator_churn", "host_bound_prep",
                          "lock_contention", "memory_throttled", "signal_storm", "ipc_lock",
                          "gpu_bound"} <= causes, causes
    # (zoo-v9's, and zoo-v11's ipc_lock and gpu_bound)
    assert len(set(NAMES) | set(V5_NAMES)) >= 25


# Scenarios the report does not (yet) name right, and what it says instead: each an expected failure that turns red
# when it is fixed.
V5_GAPS = {
    "fsync_logging": "a tiny model host-bound all along (GPU ~13% busy, said as the steady state, HIGH) slowed 1.2x "
                     "by an fsync per step: under the 1.5x a slow phase needs, and a per-second share under the 20% a "
                     "steady finding needs, so the fsync is not named",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=V5_GAPS[n], strict=True))
                                  if n in V5_GAPS else n for n in V5_NAMES])
def test_the_v5_report_names_the_staged_cause(v5_stores: Path, name: str) -> None:
    """Every v5 scenario, held-out ones included once they were scored (split.json keeps their first scores)."""
    check_verdict(_report(v5_stores, name), json.loads((ZOO_V5 / f"{name}.truth.json").read_text()))


def check_verdict(report: Report, truth: dict) -> None:
    """What the zoo asserts of a report on a store recording `truth` (see the module's docstring)."""
    top = _top(report)
    assert report.verdict, "the report leads with a verdict"
    if truth["cause"] in ("none", "gpu_bound"):
        assert not top, [f"{c.severity} {c.root_cause}: {c.summary}" for c in top]
        return
    if (truth.get("throughput_ratio") or WEAK_RATIO) < WEAK_RATIO and not top:
        return  # too weak to be a slow phase: nothing else is blamed
    if truth["cause"] == "lazy_module_loading" and not top:
        # Recorded on the H200 (CUDA 13), the staged cause turned out small: the first launches of ~140 distinct
        # kernels cost well under 1% of the feeding time beyond a normal launch. The report must size it so (the
        # cold start in the minor list, with its numbers from the rows) and blame nothing else for the first pass.
        assert any(line.startswith("cold-start:") and "first launches of distinct kernels" in line
                   for line in report.minor)
        return
    assert top, f"no HIGH/MEDIUM chain; chains: {[c.summary for c in report.chains]}"
    chain = top[0]
    assert chain.root_cause in CAUSES[truth["cause"]], f"{chain.root_cause}: {chain.summary}"
    # the culprit: the staged processes/threads, or the feeding process for causes of its own making
    if truth["culprits"]:
        named = {c.pid for c in chain.culprits} | {t for c in chain.culprits for t in c.tids}
        comms = {c.comm for c in chain.culprits}
        staged = {c["pid"] for c in truth["culprits"]} | {t for c in truth["culprits"] for t in c.get("tids", [])}
        staged_comms = {c.get("comm") for c in truth["culprits"]}
        assert named & staged or comms & staged_comms, (chain.culprits, truth["culprits"])
    else:
        assert truth["feeder"]["pid"] in chain.pids, (chain.pids, truth["feeder"])
    # the window, within a second at each end: the staged window, or where the cause recurred in it (its episodes)
    if truth.get("window_ns") and chain.window:
        start, end = truth["window_ns"]
        if truth.get("episodes_ns"):
            start, end = truth["episodes_ns"][0][0], truth["episodes_ns"][-1][1]
        assert abs(chain.window.start_ns - start) <= SECOND, (chain.window, truth["window_ns"])
        assert abs(chain.window.end_ns - end) <= SECOND, (chain.window, truth["window_ns"])


def test_a_process_started_per_step_is_named_with_its_children_and_recomputed(v5_stores: Path) -> None:
    """shell_out_per_step: nvidia-smi run after every step. The chain names the children started in the window, and
    its evidence SQL recomputes their count from the store's process rows."""
    report = _report(v5_stores, "shell_out_per_step")
    chain = _top(report)[0]
    assert chain.root_cause == "spawning-processes", chain.summary
    assert "child processes in that window (nvidia-smi[" in chain.summary and "in all)" in chain.summary
    ev = next(e for e in chain.evidence if e.name.startswith("child processes started in the window"))
    con = open_store(v5_stores / "shell_out_per_step.duckdb")
    try:
        count, comm, life_ns, pids = con.execute(ev.sql).fetchall()[0]
    finally:
        con.close()
    assert comm == "nvidia-smi" and count >= 200 and str(ev.value).startswith(f"{count}, nvidia-smi")
    assert 0 < life_ns < 2_000_000_000 and {c.pid for c in chain.culprits} & set(pids)


def test_host_memory_pinned_every_step_is_named_by_its_calls(v5_stores: Path) -> None:
    """host_register_per_step: the churn is host memory page-locked and released (the calls named, the fix is to pin
    once), not the caching allocator emptied."""
    chain = _top(_report(v5_stores, "host_register_per_step"))[0]
    assert chain.root_cause == "allocator-churn" and "page-locked and released host memory" in chain.summary
    assert "cuMemHostRegister" in chain.summary and "empty_cache" not in chain.summary
    assert any("Pin host memory once" in r for r in chain.recommendations)


def test_a_send_blocked_on_a_slow_receiver_gets_the_senders_fix(v5_stores: Path) -> None:
    """tcp_metrics_sink: the main thread blocked in sendto() to a metrics daemon that read slowly. It is said as a
    wait for the receiver, named with the fix to send off the loop; not the receiving side's 'fetch ahead', and no
    number left unknown ('?') in the fix."""
    chain = _top(_report(v5_stores, "tcp_metrics_sink"))[0]
    assert chain.root_cause == "network-wait" and "(sendto())" in chain.summary, chain.summary
    assert "waited for the receiver to take what it sent" in chain.summary, chain.summary
    fix = chain.recommendations[0]
    assert "Send from another thread or process" in fix and "metricsd[887]" in fix and "?" not in fix, fix
    assert "fetch ahead" not in fix.lower(), fix
