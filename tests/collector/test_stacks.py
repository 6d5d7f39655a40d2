"""User stacks and on-CPU samples (schema v6), for real: the stand-in training loop built with frame pointers
(tests/standin/stacks.c) must be named by its functions in `stack_samples` and `sched_intervals.ustack_id`.

Same requirements and stand-ins as tests/collector/test_collector.py (root, BCC, kernel headers, tracefs).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from harness import StandIn, Workload, build_standin, record, require_ebpf

pytestmark = pytest.mark.ebpf

STEPS = 120  # x ~10 ms on CPU in build_batch_standin, a checkpoint (fsync + 5 ms asleep) every 4th step
HZ = 199


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One recording of `stacks STEPS` at --stack-hz HZ: the open store and the workload's pid."""
    require_ebpf()
    from ingero_mcp.store import open_store

    standin: StandIn = build_standin(tmp_path_factory.mktemp("standin"))
    db = tmp_path_factory.mktemp("stacks") / "stacks.duckdb"
    w = Workload(standin, str(STEPS), binary=standin.stacks)
    collector = record(db, [w], "--stack-hz", str(HZ), timeout=120)
    con = open_store(db)
    try:
        yield {"con": con, "pid": w.pid, "out": w.out, "stderr": collector.output()}
    finally:
        con.close()


def _q(con: Any, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    return con.execute(sql, params or []).fetchall()


def test_on_cpu_samples_name_the_busy_function_and_its_caller(stacks: dict[str, Any]) -> None:
    """Most samples of the loop fall in build_batch_standin, called from train_step_standin, called from main; each
    names a stored 'user' stack whose frames carry their module."""
    con, pid = stacks["con"], stacks["pid"]
    n, named, with_caller, dangling = _q(con, """
        SELECT count(*),
               count(*) FILTER (s.frames[1] = 'build_batch_standin' OR list_contains(s.frames, 'build_batch_standin')),
               count(*) FILTER (list_position(s.frames, 'build_batch_standin') < list_position(s.frames,
                                'train_step_standin') AND list_position(s.frames, 'train_step_standin')
                                < list_position(s.frames, 'main')),
               count(*) FILTER (x.ustack_id IS NOT NULL AND s.stack_id IS NULL)
        FROM stack_samples x LEFT JOIN stacks s ON s.stack_id = x.ustack_id WHERE x.pid = ?""", [pid])[0]
    # ~1.2 s on CPU at HZ per CPU: ~240 samples if nothing else ran; a loaded machine gives fewer
    assert n >= 40, n
    assert named >= 0.8 * n and with_caller >= 0.7 * n and dangling == 0, (n, named, with_caller, dangling)
    modules = dict(_q(con, """SELECT f, any_value(m) FROM (SELECT unnest(frames) AS f, unnest(modules) AS m
                                                           FROM stacks WHERE kind = 'user') GROUP BY f"""))
    assert modules.get("build_batch_standin") == "stacks" and modules.get("main") == "stacks", modules
    kinds = _q(con, "SELECT DISTINCT s.kind, s.files IS NULL AND s.lines IS NULL FROM stack_samples x "
                    "JOIN stacks s ON s.stack_id = x.ustack_id WHERE x.pid = ?", [pid])
    assert kinds == [("user", True)], kinds
    # traced threads only, and the sampled CPU and time are plausible
    other, cpus = _q(con, "SELECT count(*) FILTER (pid <> ?), count(DISTINCT cpu) FROM stack_samples", [pid])[0]
    assert other == 0 and cpus >= 1


def test_a_sleep_names_the_function_that_blocked(stacks: dict[str, Any]) -> None:
    """The checkpoint's fsync and nanosleep switch-outs carry a user stack through write_checkpoint_standin; a
    preemption takes none (the switch-out path pays for the walk only where it takes the kernel stack)."""
    con, pid = stacks["con"], stacks["pid"]
    rows = _q(con, """
        SELECT i.syscall, count(*),
               count(*) FILTER (list_contains(s.frames, 'write_checkpoint_standin')
                                AND list_contains(s.frames, 'train_step_standin'))
        FROM sched_intervals i JOIN stacks s ON s.stack_id = i.ustack_id
        WHERE i.pid = ? AND i.prev_state IN ('sleeping', 'uninterruptible') GROUP BY ALL""", [pid])
    by_call = {r[0]: r[1:] for r in rows}
    asleep = by_call.get("nanosleep") or by_call.get("clock_nanosleep")
    assert asleep is not None and asleep[0] >= STEPS // 4 * 0.8 and asleep[1] >= 0.9 * asleep[0], rows
    assert _q(con, "SELECT count(ustack_id) FROM sched_intervals WHERE prev_state = 'preempted'")[0][0] == 0
    missing = _q(con, """SELECT count(*) FROM sched_intervals WHERE ustack_id IS NOT NULL
                         AND ustack_id NOT IN (SELECT stack_id FROM stacks)""")[0][0]
    assert missing == 0


def test_stack_sources_say_how_the_stacks_were_taken(stacks: dict[str, Any]) -> None:
    """One row per traced process: frame pointers seen (the walk went past the leaf), the sampling rate, no Python."""
    con, pid = stacks["con"], stacks["pid"]
    rows = _q(con, "SELECT pid, python, python_frames, frame_pointers, sample_hz FROM stack_sources")
    assert rows == [(pid, None, False, True, HZ)], rows
    notes = json.loads(_q(con, "SELECT notes FROM sessions")[0][0])
    assert notes["stack_samples"]["hz"] == HZ and notes["stack_samples"]["ring_full"] == 0, notes["stack_samples"]
    assert notes["user_stacks"]["distinct"] == _q(con, "SELECT count(*) FROM stacks WHERE kind <> 'kernel'")[0][0]
    seen, stored, lost = _q(con, "SELECT events_seen, events_stored, events_lost FROM collector_stats "
                                 "WHERE source = 'stack_samples'")[0]
    assert seen == stored == _q(con, "SELECT count(*) FROM stack_samples")[0][0] and lost == 0
