"""Python frames through the whole collector, for real: a CPython process (this interpreter, tests/standin/pyloop.py)
traced with `trace --pid`, its samples and sleeps named by the Python functions the eBPF program walked from the
interpreter's own thread state (collectors/pyframes.bpf.h), merged into 'python' stacks at the fold.

Same requirements as tests/collector/test_collector.py (root, BCC, kernel headers, tracefs).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Workload, record, require_ebpf

pytestmark = pytest.mark.ebpf

SCRIPT = Path(__file__).resolve().parents[1] / "standin" / "pyloop.py"


@pytest.fixture(scope="module")
def pystacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_ebpf()
    from ingero_mcp.store import open_store

    db = tmp_path_factory.mktemp("pystacks") / "py.duckdb"
    w = Workload(None, str(SCRIPT), "3", binary=Path(sys.executable))  # type: ignore[arg-type]
    record(db, [w], "--stack-hz", "99", timeout=120)
    con = open_store(db)
    try:
        yield {"con": con, "pid": w.pid}
    finally:
        con.close()


def test_the_process_is_walked_as_cpython(pystacks: dict[str, Any]) -> None:
    con, pid = pystacks["con"], pystacks["pid"]
    rows = con.execute("SELECT python, python_frames, sample_hz FROM stack_sources WHERE pid = ?", [pid]).fetchall()
    assert rows == [(f"{sys.version_info.major}.{sys.version_info.minor}", True, 99)], rows


def test_samples_name_the_python_function_and_its_callers(pystacks: dict[str, Any]) -> None:
    """Most on-CPU samples of the main thread: build_batch <- train_step <- main, with the script's path and the
    lines of their definitions."""
    con, pid = pystacks["con"], pystacks["pid"]
    n, named = con.execute("""
        SELECT count(*), count(*) FILTER (s.kind = 'python' AND list_position(s.frames, 'build_batch')
                                           < list_position(s.frames, 'train_step')
                                           AND list_position(s.frames, 'train_step') < list_position(s.frames, 'main'))
        FROM stack_samples x LEFT JOIN stacks s ON s.stack_id = x.ustack_id WHERE x.pid = ? AND x.tid = ?""",
                           [pid, pid]).fetchall()[0]
    assert n >= 30 and named >= 0.7 * n, (n, named)
    lines = dict(con.execute("""SELECT f, any_value(l) FROM (SELECT unnest(frames) AS f, unnest(files) AS p,
                                       unnest(lines) AS l FROM stacks WHERE kind = 'python')
                                WHERE p = ? GROUP BY f""", [str(SCRIPT)]).fetchall())
    source = SCRIPT.read_text().splitlines()
    for function in ("build_batch", "train_step", "write_checkpoint"):
        assert function in lines, lines
        assert source[lines[function] - 1].startswith(f"def {function}("), (function, lines[function])


def test_the_writer_thread_blocks_in_its_function(pystacks: dict[str, Any]) -> None:
    """The checkpoint thread (not the GIL holder most of the time) sleeps in fsync and time.sleep inside
    write_checkpoint: its switch-out stacks say so, with a native frame (the system call's wrapper) innermost."""
    con, pid = pystacks["con"], pystacks["pid"]
    n, named = con.execute("""
        SELECT count(*), count(*) FILTER (list_contains(s.frames, 'write_checkpoint'))
        FROM sched_intervals i JOIN stacks s ON s.stack_id = i.ustack_id
        WHERE i.pid = ? AND i.tid <> ? AND i.syscall IN ('fsync', 'clock_nanosleep', 'nanosleep', 'select')""",
                           [pid, pid]).fetchall()[0]
    assert n >= 10 and named >= 0.9 * n, (n, named)


def test_the_sampler_cost_is_in_the_estimate(pystacks: dict[str, Any]) -> None:
    """The collector records what a sample costs (the kernel's timing, or the H200's figure, saying which), and the
    tracing cost counts the samples with it."""
    from ingero_mcp.analysis.cost import tracing_cost

    con = pystacks["con"]
    rows = con.execute("SELECT cost_ns, method FROM probe_costs WHERE probe = 'stack_sample'").fetchall()
    assert len(rows) == 1 and rows[0][0] > 0 and rows[0][1].startswith(("measured by the kernel", "default")), rows
    samples = con.execute("SELECT count(*) FROM stack_samples").fetchall()[0][0]
    t = tracing_cost(con)
    assert t is not None and t.samples == samples > 0
    assert t.sample_added_ns == round(samples * rows[0][0])
