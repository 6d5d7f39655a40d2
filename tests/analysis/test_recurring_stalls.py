"""A stall that recurs is one story: slow phases that come back alike (a checkpoint written every few seconds) make one
recurrent phase whose finding sums them, said as 'stalled N times, every P s' with the fix of what stalled it; two
unlike slowdowns stay two phases; small host-side findings are not hidden behind the GPU's own slow stretches. Small
stores written through the real TraceWriter."""

from __future__ import annotations

from pathlib import Path

from analysis_fixtures import check_evidence_sql
from test_analysis_mechanisms import CALL_COLS, IV_COLS, MS, PID, S, T0, _cols, _iv, _loop, _session

from ingero_mcp.analysis.accounting import accounting
from ingero_mcp.analysis.models import CausalChain
from ingero_mcp.analysis.report import build_report
from ingero_mcp.analysis.verdict import verdict
from ingero_mcp.store import TraceWriter, open_store

WRITEBACK = ["__schedule", "schedule", "io_schedule", "rq_qos_wait", "wbt_wait", "blk_mq_submit_bio",
             "submit_bio", "ext4_writepages", "do_writepages", "filemap_fdatawrite_wbc", "ext4_rename",
             "__x64_sys_rename"]


def stalls_store(path: Path, stalls: list[tuple[float, float]], end_s: int = 32) -> Path:
    """end_s seconds of a loop at 100 steps/s whose main thread, in each (start s, length s) of `stalls`, stops its
    steps and sleeps in IO (D state) writing a file out, ended by the disk's interrupt."""
    calls, ivs = _cols(*CALL_COLS), _cols(*IV_COLS)
    t = T0 + 100 * MS
    for start, length in stalls:
        _loop(t, T0 + int(start * S), 10 * MS, calls)
        a, b = T0 + int(start * S), T0 + int((start + length) * S)
        _iv(ivs, PID, a + MS, b - 3 * MS, "uninterruptible", wake=b - 4 * MS, waker=(0, "swapper/3", "softirq"),
            syscall="rename", kstack=9)
        t = b
    _loop(t, T0 + end_s * S - 100 * MS, 10 * MS, calls)
    with TraceWriter(path) as w:
        _session(w, end_s)
        w.replace("processes", {"pid": [PID], "ppid": [1], "comm": ["python3"], "traced": [True]})
        w.append("cuda_calls", calls)
        w.append("sched_intervals", ivs)
        w.append("stacks", {"stack_id": [9], "kind": ["kernel"], "frames": [WRITEBACK]})
    return path


def test_slow_phases_that_recur_alike_are_one_stall_said_once(tmp_path: Path) -> None:
    db = stalls_store(tmp_path / "saves.duckdb", [(8.0, 2.0), (14.0, 2.0), (20.0, 2.0), (26.0, 2.0)])
    con = open_store(db)
    acc = accounting(con)
    recurrent = [p for p in acc.phases if p.kind == "recurrent"]
    assert not [p for p in acc.phases if p.kind == "slow"], acc.phases
    assert len(recurrent) == 1 and len(recurrent[0].stretches) == 4 == len(recurrent[0].episodes), recurrent
    phase = recurrent[0]
    assert phase.period_s == 6.0 and 7.0 <= (phase.lost_s or 0) <= 8.0, phase  # 4 x 2 s, next to no step in them
    # the episodes' SQL recomputes them: four, their loss as the phase says
    got = con.execute(f"SELECT count(*), round(sum(lost_s), 3) FROM ({phase.sql})").fetchone()
    assert got == (4, phase.lost_s), (got, phase)
    report = build_report(con)
    io = [c for c in report.chains if c.root_cause == "io-wait"]
    assert len(io) == 1, [(c.severity, c.root_cause, c.summary) for c in report.chains]
    chain = io[0]
    assert "stalled 4 times" in chain.summary and "every 6.0 s" in chain.summary, chain.summary
    assert "writing a file's data out to disk" in chain.summary and "(rename())" in chain.summary, chain.summary
    assert chain.severity in ("HIGH", "MEDIUM") and (chain.seconds_lost or 0) >= 4 * 1.5, chain
    assert "slow episodes that recur (4 slow stretches" in " ".join(e.name for e in chain.evidence), chain.evidence
    assert any("waiting for writes to reach the disk" in r for r in chain.recommendations), chain.recommendations
    assert not any("read the data ahead" in r.lower() for r in chain.recommendations), chain.recommendations
    assert check_evidence_sql(con, [chain]) >= 4


def test_slowdowns_unlike_in_length_stay_phases_of_their_own(tmp_path: Path) -> None:
    db = stalls_store(tmp_path / "unlike.duckdb", [(6.0, 2.0), (12.0, 6.0), (22.0, 2.0)])
    acc = accounting(open_store(db))
    slow = [p for p in acc.phases if p.kind == "slow"]
    assert len(slow) == 3 and not [p for p in acc.phases if p.kind == "recurrent"], acc.phases


def test_two_stalls_are_not_yet_a_recurrence(tmp_path: Path) -> None:
    db = stalls_store(tmp_path / "two.duckdb", [(8.0, 2.0), (18.0, 2.0)])
    acc = accounting(open_store(db))
    assert len([p for p in acc.phases if p.kind == "slow"]) == 2, acc.phases
    assert not [p for p in acc.phases if p.kind == "recurrent"], acc.phases


def _chain(cause: str, seconds: float) -> CausalChain:
    return CausalChain(id=f"{cause}:1/1@0s", op=cause, severity="LOW", summary=f"{cause} for {seconds} s",
                       root_cause=cause, explanation="", seconds_lost=seconds)


def test_no_host_side_cause_is_said_only_where_the_gpus_stretches_outweigh_the_hosts() -> None:
    """Four one-second stretches the GPU's own work paced (0.7 s each) beside six LOW host-side findings of the same
    stalls (4.2 s together): 'No host-side cause' would hide the larger part (the checkpoint store before its saves
    were one story said it)."""
    mixed = [_chain("gpu-bound", 0.7)] * 4 + [_chain("io-wait", 1.0), _chain("excess-sync", 0.9)] * 3
    lines = verdict(None, mixed, None)
    assert not any(v.startswith("No host-side cause") for v in lines), lines
    assert any("6 LOW findings on the host side (5.7 s together)" in v and "4 slow stretches" in v and "(2.8 s)" in v
               for v in lines), lines
    alone = verdict(None, [_chain("gpu-bound", 0.7), _chain("io-wait", 0.2)], None)
    assert any(v.startswith("No host-side cause: gpu-bound for 0.7 s") for v in alone), alone
