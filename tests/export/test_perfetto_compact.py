"""Issue 20: the export's faster paths write the same timeline, in the layout they promise.

Calls read in the table's own order when it is time order per thread (no DuckDB sort), else sorted;
each slice's END packet right after its BEGIN on its sequence, timestamped with the slice's duration.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto_decode import decode, timeline

from ingero_mcp.cli import main
from ingero_mcp.demo import generate
from ingero_mcp.export import events as ev
from ingero_mcp.export import perfetto as pf

TE = pb.TrackEvent


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("compact") / "dataloader.duckdb"
    generate("dataloader", db, scale=0.2)
    return db


def calls_table(rows: list[tuple[int, int]]) -> duckdb.DuckDBPyConnection:
    """An in-memory cuda_calls of (tid, ts_ns) rows, inserted in the order given."""
    con = duckdb.connect()
    con.execute("CREATE TABLE cuda_calls (tid INTEGER, ts_ns BIGINT, pid INTEGER)")
    if rows:
        con.executemany("INSERT INTO cuda_calls VALUES (?, ?, 1)", rows)
    return con


@pytest.mark.parametrize(("rows", "ordered"), [
    ([(1, 10), (2, 11), (1, 12), (2, 12)], True),  # time order, threads interleaved (live ingest)
    ([(2, 30), (2, 40), (1, 10), (1, 20)], True),  # each thread's together, each in time order
    ([(1, 10), (2, 5), (1, 20), (2, 6)], False),  # per thread in order, but threads interleaved out of time order
    ([(1, 20), (1, 10)], False),
    ([(1, 10), (2, 20), (1, 30), (2, 5)], False),
    ([], True),
])
def test_calls_in_time_order(rows: list[tuple[int, int]], ordered: bool) -> None:
    assert ev.calls_in_time_order(calls_table(rows), ev.Scope()) is ordered


def test_calls_out_of_order_are_sorted(demo_db: Path, tmp_path: Path) -> None:
    """A store whose calls were inserted shuffled exports the same timeline as the one in time order."""
    shuffled = tmp_path / "shuffled.duckdb"
    shutil.copyfile(demo_db, shuffled)
    con = duckdb.connect(str(shuffled))
    con.execute("CREATE TEMP TABLE t AS SELECT * FROM cuda_calls ORDER BY hash(ts_ns)")
    con.execute("DELETE FROM cuda_calls")
    con.execute("INSERT INTO cuda_calls BY NAME SELECT * EXCLUDE (kernel_handle) FROM t")  # v10: computed
    con.close()
    outs = []
    for db in (demo_db, shuffled):
        out = tmp_path / f"{db.stem}.pftrace"
        assert main(["export", "--db", str(db), "-o", str(out)]) == 0
        outs.append(timeline(decode(out)))
    assert outs[0] == outs[1]
    assert sum(map(len, outs[0].values())) > 1000


def test_each_end_follows_its_begin(demo_db: Path, tmp_path: Path) -> None:
    """On every bulk sequence a BEGIN's next packet is its END (its timestamp delta: the slice's duration, >= 1 ns);
    a state that begins as the one before it ends is then 0 ns after that END."""
    out = tmp_path / "run.pftrace"
    assert main(["export", "--db", str(demo_db), "-o", str(out)]) == 0
    trace = pb.Trace()
    trace.ParseFromString(out.read_bytes())
    last: dict[int, pb.TracePacket] = {}
    pairs = zero_gaps = 0
    for p in trace.packet:
        seq, kind = p.trusted_packet_sequence_id, p.track_event.type
        before = last[seq].track_event.type if seq in last else None
        if seq > 2:  # the bulk sequences (1: one-offs, 2: stack samples)
            assert (before == TE.TYPE_SLICE_BEGIN) == (kind == TE.TYPE_SLICE_END)
            pairs += kind == TE.TYPE_SLICE_END and p.timestamp >= 1
            zero_gaps += kind == TE.TYPE_SLICE_BEGIN and before == TE.TYPE_SLICE_END and p.timestamp == 0
        last[seq] = p
    assert pairs > 1000 and zero_gaps > 100


@pytest.mark.parametrize("span", [1_000, 1 << 50])  # one int64 key and a stable sort; lexsort past 2^47 ns
def test_states_ordered_by_sequence_then_time(span: int) -> None:
    """The thread states, read in no order, go out per sequence in time order, ties in the order read."""
    rng = np.random.default_rng(7)
    seqs = rng.integers(3, 40, 5000).astype(np.int32)
    ts = rng.integers(0, 50, 5000) * (span // 50) + 10**15
    order = pf._track_time_order(seqs, ts)
    assert order.tolist() == sorted(range(len(ts)), key=lambda i: (seqs[i], ts[i], i))
    assert pf._track_time_order(seqs[:0], ts[:0]).tolist() == []


def test_woken_from_the_states_as_from_thread_state(demo_db: Path, tmp_path: Path) -> None:
    """Wake-ups whose wakee ran at once (no CPU wait) end on a 'woken' instant: found among the states read for a
    whole-store export, by thread_state's SQL with pids; the two give the same timeline."""
    db = tmp_path / "woken.duckdb"
    shutil.copyfile(demo_db, db)
    con = duckdb.connect(str(db))
    # back on a CPU as it was woken (cpu_wait_ns 0: schemas/v10.sql computes it from the moments)
    con.execute("UPDATE sched_intervals SET on_ns = wakeup_ns WHERE wakeup_ns IS NOT NULL AND hash(off_ns) % 3 = 0")
    pids = [str(r[0]) for r in con.execute("SELECT DISTINCT pid FROM sched_intervals UNION "
                                           "SELECT DISTINCT pid FROM cuda_calls").fetchall()]
    con.close()
    outs = []
    for extra in ([], [a for pid in pids for a in ("--pid", pid)]):
        out = tmp_path / f"run{len(extra)}.pftrace"
        assert main(["export", "--db", str(db), "-o", str(out), *extra]) == 0
        outs.append(timeline(decode(out)))
    woken = [r for rows in outs[0].values() for r in rows if r[:2] == ("instant", "woken")]
    assert len(woken) > 100
    assert outs[0] == outs[1]


def test_state_columns_grow_past_their_bound(demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The states' arrays are sized from the intervals; were that bound wrong (here: 0), they grow, same timeline."""
    out = tmp_path / "sized.pftrace"
    assert main(["export", "--db", str(demo_db), "-o", str(out)]) == 0
    rows = ev.rows

    def no_room(con: duckdb.DuckDBPyConnection, sql: str) -> list:
        return [(0,)] if sql == "SELECT count(*) FROM sched_intervals" else rows(con, sql)

    monkeypatch.setattr(ev, "BATCH", 1000)  # several batches, several growths
    monkeypatch.setattr(ev, "rows", no_room)
    grown = tmp_path / "grown.pftrace"
    assert main(["export", "--db", str(demo_db), "-o", str(grown)]) == 0
    assert timeline(decode(grown)) == timeline(decode(out))
