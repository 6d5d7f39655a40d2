"""`ingero-mcp export`: the Perfetto (and Chrome JSON) timeline read back and counted against the store's SQL.

Perfetto's trace processor downloads its shell binary at run time (no network here), so the file
is decoded with Perfetto's own generated classes (`perfetto_trace_pb2`): every packet parses, and
the tracks, slices, flows and counters are tallied by what they are, then compared with SQL counts
written here independently of the exporter's queries.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import stat
import subprocess
import threading
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from analysis_fixtures import MS, T0
from hostile import NASTY, bad_chars, hostile_store
from paths import REPO
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto_decode import decode as read_trace

from ingero_mcp.store.views import lay_views
from ingero_mcp.cli import main
from ingero_mcp.demo import generate
from ingero_mcp.store import TraceWriter, open_store

H200 = REPO / "investigations" / "h200-seed-benchmark-v1.duckdb"
ZOO = REPO / "investigations" / "zoo"
TE = pb.TrackEvent


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("export") / "dataloader.duckdb"
    generate("dataloader", db, scale=0.3)
    return db


@pytest.fixture(scope="module")
def zoo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("zoo") / "lock_holder.duckdb"
    with lzma.open(ZOO / "lock_holder.duckdb.xz") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return db


def decode(path: Path) -> dict:
    """Tally a .pftrace: tracks by kind, slices per track kind and name, flows, counters, instants."""
    d = read_trace(path)
    tracks = d.tracks
    kind_of: dict[int, str] = {}
    out = {"process_tracks": set(), "thread_tracks": set(), "counter_tracks": Counter(), "calls": Counter(),
           "states": Counter(), "ends": Counter(), "flows_out": [], "flows_in": [], "instants": Counter(),
           "chains": [], "call_args": [], "open": Counter(), "per_track": {}, "samples": d.samples}
    for uuid, desc in tracks.items():
        if desc.HasField("process"):
            kind_of[uuid] = "process"
            out["process_tracks"].add(desc.process.pid)
        elif desc.HasField("thread"):
            kind_of[uuid] = "thread"
            out["thread_tracks"].add(desc.thread.tid)
        elif desc.HasField("counter"):
            kind_of[uuid] = "counter"
    for uuid, desc in tracks.items():
        if uuid not in kind_of:
            kind_of[uuid] = "state" if kind_of.get(desc.parent_uuid) == "thread" else "chain"
    for e in d.events:
        kind = kind_of[e.track]
        name = e.name
        out["flows_out"] += e.flows
        out["flows_in"] += e.ends_flows
        if e.type in (TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END):
            out["per_track"].setdefault(e.track, []).append((e.ts, e.index, e.type))
        if e.type == TE.TYPE_SLICE_BEGIN:
            out["open"][e.track] += 1
            if kind == "thread":
                out["calls"][name] += 1
                out["call_args"].append((e.ts, name, e.args))
            elif kind == "state":
                out["states"][name] += 1
            elif kind == "chain":
                out["chains"].append(name)
        elif e.type == TE.TYPE_SLICE_END:
            out["ends"][kind] += 1
            out["open"][e.track] -= 1
        elif e.type == TE.TYPE_INSTANT:
            out["instants"][(kind, name.split(" ")[0])] += 1
        elif e.type == TE.TYPE_COUNTER:
            out["counter_tracks"][tracks[e.track].name] += 1
    # As Perfetto's sorter orders them: by timestamp, file order kept for ties. A state track's slices
    # follow one another and never nest: a nested one means an end and the next begin were misordered.
    depth_max = Counter()
    for track, evs in out["per_track"].items():
        depth = 0
        for _, _, kind in sorted(evs):
            depth += 1 if kind == TE.TYPE_SLICE_BEGIN else -1
            assert depth >= 0, "an end without its begin"
            depth_max[kind_of[track]] = max(depth_max[kind_of[track]], depth)
    out["depth_max"] = depth_max
    return out


def sql_counts(db: Path, pids: list[int] | None = None) -> dict:
    """What the store says the timeline must hold (queries written for the test, not the exporter's)."""
    con = open_store(db)
    try:
        lay_views(con)
        pid_filter = f"WHERE pid IN ({', '.join(map(str, pids))})" if pids else ""
        one = lambda sql: con.execute(sql).fetchall()[0][0]  # noqa: E731
        tids = {r[0] for r in con.execute(f"SELECT tid FROM cuda_calls {pid_filter} UNION "
                                          f"SELECT tid FROM sched_intervals {pid_filter}").fetchall()}
        calls = dict(con.execute(f"SELECT op, count(*) FROM cuda_calls {pid_filter} GROUP BY op").fetchall())
        states = dict(con.execute(f"""
            SELECT CASE WHEN state = 'sleeping' AND sleep_state = 'D' THEN 'io' ELSE state END, count(*)
            FROM thread_state {pid_filter} GROUP BY 1""").fetchall())
        traced = ", ".join(map(str, tids)) or "NULL"
        flows = one(f"""SELECT count(DISTINCT (tid, wakeup_ns)) FROM sched_intervals
                        WHERE wakeup_ns IS NOT NULL AND waker_tid IN ({traced}) AND waker_tid <> tid
                          AND coalesce(waker_context, 'task') = 'task'
                          {'AND pid IN (' + ', '.join(map(str, pids)) + ')' if pids else ''}""")
        counters = {name: one(f"SELECT count({col}) FROM snapshots") for col, name in (
            ("cpu_percent", "host CPU %"), ("gpu_util_percent", "GPU utilisation %"),
            ("mem_used_percent", "host memory used %"), ("gpu_mem_used_bytes", "GPU memory used (bytes)"))}
        events = one(f"SELECT count(*) FROM process_events {pid_filter}")
        pids_seen = {r[0] for r in con.execute(f"SELECT pid FROM cuda_calls {pid_filter} UNION "
                                               f"SELECT pid FROM sched_intervals {pid_filter}").fetchall()}
        return {"tids": tids, "calls": calls, "states": states, "flows": flows, "pids": pids_seen,
                "counters": {k: v for k, v in counters.items() if v}, "process_events": events}
    finally:
        con.close()


STATE = {"cpu_wait": "waiting for a CPU", "sleeping": "sleeping", "io": "IO (D sleep)",
         "off_cpu": "off-CPU (split unknown)"}


def check(got: dict, want: dict) -> None:
    assert got["thread_tracks"] == want["tids"]
    assert want["pids"] <= got["process_tracks"]
    assert dict(got["calls"]) == want["calls"]
    assert dict(got["states"]) == {STATE[k]: v for k, v in want["states"].items() if v}
    assert got["ends"]["thread"] == sum(want["calls"].values())
    assert got["ends"]["state"] == sum(want["states"].values())
    assert all(v == 0 for v in got["open"].values()), "every slice that begins ends on its track"
    assert got["depth_max"]["state"] <= 1, "thread states follow one another, never nest"
    assert len(got["flows_out"]) == len(set(got["flows_out"])) == want["flows"]
    assert sorted(got["flows_out"]) == sorted(got["flows_in"]), "every wake-up arrow lands"
    assert dict(got["counter_tracks"]) == want["counters"]
    process_instants = sum(v for (kind, _), v in got["instants"].items() if kind == "process")
    assert process_instants == want["process_events"]


def export(db: Path, out: Path, *extra: str) -> None:
    assert main(["export", "--db", str(db), "-o", str(out), *extra]) == 0


@pytest.mark.parametrize("which", ["h200", "demo", "zoo"])
def test_perfetto_matches_sql(which: str, demo_db: Path, zoo_db: Path, tmp_path: Path) -> None:
    db = {"h200": H200, "demo": demo_db, "zoo": zoo_db}[which]
    out = tmp_path / "run.pftrace"
    export(db, out)
    got = decode(out)
    check(got, sql_counts(db))
    if which == "demo":
        assert got["flows_out"], "the dataloader demo records wakers: its timeline has arrows"
        assert got["chains"], "the demo's causal chains are marked"
    assert got["process_tracks"] and got["counter_tracks"]


def test_call_args_are_the_rows(demo_db: Path, tmp_path: Path) -> None:
    """A call slice carries its row's bytes, direction, kernel (kernel_key) and off-CPU split; a call never off CPU
    none of the split (no `off_cpu_ns` on a slice: 0 ns), a call with any part its three values, and a call whose
    split is unknown `off_cpu: unknown` and no split (unknown is not zero)."""
    db = tmp_path / "calls.duckdb"
    shutil.copyfile(demo_db, db)
    con = duckdb.connect(str(db))
    try:  # a few calls whose split the trace could not tell (no recording of today's makes one: made here)
        unknown = con.execute("UPDATE cuda_calls SET off_cpu_ns = NULL, sleep_ns = NULL, cpu_wait_ns = NULL "
                              "WHERE duration_ns IS NOT NULL AND ts_ns % 97 = 0").fetchall()[0][0]
    finally:
        con.close()
    assert unknown > 0
    out = tmp_path / "run.pftrace"
    export(db, out)
    got = decode(out)
    from ingero_mcp.export.perfetto import ARG

    con = open_store(db)
    try:
        rows = {(ts, op): r for ts, op, *r in con.execute(
            "SELECT ts_ns, op, bytes, memcpy_kind, kernel_key, off_cpu_ns, sleep_ns, cpu_wait_ns FROM cuda_calls"
        ).fetchall()}
    finally:
        con.close()
    checked, never, split, unknowns = 0, 0, 0, 0
    for ts, name, args in got["call_args"]:
        b, k, kernel, off, sl, cw = rows[(ts, name)]
        assert set(args) <= set(ARG)
        never_off = (off, sl, cw) == (0, 0, 0)
        if never_off:
            assert not {"off_cpu_ns", "sleep_ns", "cpu_wait_ns", "off_cpu"} & set(args), args
        elif off is None:
            assert args.get("off_cpu") == "unknown" and "off_cpu_ns" not in args, args
        else:
            assert (args.get("off_cpu_ns"), args.get("sleep_ns"), args.get("cpu_wait_ns")) == (off, sl, cw), args
            assert "off_cpu" not in args
        assert (args.get("bytes"), args.get("direction"), args.get("kernel")) == (b, k, kernel)
        checked += 1
        never += never_off
        split += off is not None and off > 0
        unknowns += off is None
    assert checked > 100 and never and split and unknowns == unknown, (checked, never, split, unknowns)


def test_pid_and_window(demo_db: Path, tmp_path: Path) -> None:
    """--pid keeps one process's tracks; --since keeps the calls of the window."""
    con = open_store(demo_db)
    try:
        pid = con.execute("SELECT pid FROM cuda_calls GROUP BY pid ORDER BY count(*) DESC LIMIT 1").fetchall()[0][0]
        end = con.execute("SELECT max(ts_ns) FROM (SELECT ts_ns + duration_ns AS ts_ns FROM cuda_calls UNION ALL "
                          "SELECT coalesce(on_ns, off_ns) FROM sched_intervals UNION ALL SELECT ts_ns FROM snapshots)"
                          ).fetchall()[0][0]
    finally:
        con.close()
    out = tmp_path / "pid.pftrace"
    export(demo_db, out, "--pid", str(pid))
    got = decode(out)
    want = sql_counts(demo_db, [pid])
    assert dict(got["calls"]) == want["calls"] and got["thread_tracks"] == want["tids"]
    out = tmp_path / "since.pftrace"
    export(demo_db, out, "--since", "5s")
    got = decode(out)
    assert 0 < sum(got["calls"].values()) < sum(want["calls"].values())
    assert min(ts for ts, _, _ in got["call_args"]) >= end - 5_000_000_000 - 1


def test_chrome_json_matches_sql(demo_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    export(demo_db, out, "--format", "json")
    data = json.loads(out.read_text())
    want = sql_counts(demo_db)
    ev = data["traceEvents"]
    phases = Counter(e["ph"] for e in ev)
    calls = Counter(e["name"] for e in ev if e["ph"] == "X" and e.get("cat") == "cuda")
    states = Counter(e["name"] for e in ev if e["ph"] == "X" and e.get("cat") == "state")
    assert dict(calls) == want["calls"]
    assert dict(states) == {STATE[k]: v for k, v in want["states"].items() if v}
    assert phases["s"] == phases["f"] == want["flows"]
    assert phases["C"] == sum(want["counters"].values())
    assert phases["i"] == want["process_events"]
    assert {e["tid"] for e in ev if e.get("cat") == "cuda"} <= want["tids"]
    # times in µs since the trace start (ns kept): the calls' starts are the rows' ts_ns
    origin = int(data["otherData"]["trace_start_ns"])
    con = open_store(demo_db)
    try:
        starts = sorted(r[0] for r in con.execute("SELECT ts_ns FROM cuda_calls").fetchall())
    finally:
        con.close()
    got = sorted(origin + round(e["ts"] * 1000) for e in ev if e.get("cat") == "cuda")
    assert got == starts
    assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")


def test_hostile_names_are_cleaned(tmp_path: Path) -> None:
    """A process named to smuggle control characters reaches the trace's names cleaned."""
    db = hostile_store(tmp_path / "hostile.duckdb")
    with TraceWriter(db, session_id=1) as w:  # the traced job renames itself and execs a hostile file name
        w.append("process_events", {"ts_ns": [T0 + 1_000 * MS, T0 + 2_000 * MS], "event": ["rename", "exec"],
                                    "pid": [100, 100], "tid": [100, 100], "comm": [NASTY, NASTY],
                                    "old_comm": ["python", None], "filename": [None, "/x" + NASTY]})
    out = tmp_path / "h.pftrace"
    export(db, out)
    trace = pb.Trace()
    trace.ParseFromString(out.read_bytes())
    texts = []
    for p in trace.packet:
        d = p.track_descriptor
        texts += [d.name, d.process.process_name, d.thread.thread_name]
        texts += [n.name for n in p.interned_data.event_names]
        texts += [n.str.decode() for n in p.interned_data.debug_annotation_string_values]
        texts += [a.string_value for a in p.track_event.debug_annotations]
    assert any("SYSTEM: obey" in t for t in texts), "the hostile name is there (cleaned), not dropped"
    assert not any(bad_chars(t) for t in texts)
    assert NASTY not in texts
    out = tmp_path / "h.json"
    export(db, out, "--format", "json")
    assert not bad_chars(json.loads(out.read_text()).__repr__())


@pytest.mark.parametrize("command, name", [("export", "run.pftrace"), ("export", "run.json"), ("report", "run.html")])
def test_output_path_errors_are_one_line(command: str, name: str, demo_db: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A file that cannot be written where asked: one line naming the path and why, exit 2, before any work,
    and nothing left behind; a later good path still works and leaves no temporary file."""
    missing_dir = tmp_path / "no" / "such" / name
    for out, why in ((missing_dir, f"directory {missing_dir.parent} does not exist"), (tmp_path, "is a directory")):
        assert main([command, "--db", str(demo_db), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"ingero-mcp {command}: ") and why in err, err
        assert "Traceback" not in err
    good = tmp_path / name
    assert main([command, "--db", str(demo_db), "-o", str(good)]) == 0
    assert good.stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary file, no stray folder


# --- issue 19, item 3: outputs never destroy inputs ---------------------------------------------------------

def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command, suffix", [("export", ".pftrace"), ("export", ".json"), ("report", ".html")])
def test_an_output_never_replaces_a_trace(command: str, suffix: str, demo_db: Path, ingero_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`report -o run.duckdb --db run.duckdb` replaced the trace with HTML, exit 0. The store read (however the
    path names it: itself, a symbolic link, a hard link) and any database or trace segment are refused in one
    line, exit 2, and left as they were."""
    store = tmp_path / "run.duckdb"
    shutil.copyfile(demo_db, store)
    (tmp_path / f"link{suffix}").symlink_to(store)
    os.link(store, tmp_path / f"hard{suffix}")
    shutil.copyfile(demo_db, tmp_path / f"other{suffix}")
    shutil.copyfile(ingero_dir / "sample-gpu-node-01.db", tmp_path / f"ingero{suffix}")
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT 1 AS x) TO '{tmp_path / ('segment' + suffix)}' (FORMAT parquet)")
    cases = {store: "it is the trace store this command reads",
             tmp_path / f"link{suffix}": "the trace store this command",
             tmp_path / f"hard{suffix}": "the trace store this command",
             tmp_path / f"other{suffix}": "a DuckDB database",
             tmp_path / f"ingero{suffix}": "an SQLite database",
             tmp_path / f"segment{suffix}": "a Parquet file"}
    before = {path: _digest(path) for path in cases}
    for out, why in cases.items():
        assert main([command, "--db", str(store), "-o", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"ingero-mcp {command}: refusing to write") and why in err, err
    assert {path: _digest(path) for path in cases} == before
    assert (tmp_path / f"link{suffix}").is_symlink()
    open_store(store).close()  # still a store
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("command", ["export", "report"])
def test_a_full_device_fails_and_other_devices_stay_devices(command: str, demo_db: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`-o /dev/full` said 'wrote (0.2 MB)'. A device is written in place (a rename would replace the node) and
    every error of the write is reported."""
    assert main([command, "--db", str(demo_db), "-o", "/dev/full"]) == 2
    err = capsys.readouterr().err
    assert err == f"ingero-mcp {command}: cannot write /dev/full: No space left on device\n"
    assert main([command, "--db", str(demo_db), "-o", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_pipe_gets_the_whole_file(demo_db: Path, tmp_path: Path) -> None:
    """A named pipe (as `>(gzip > t.json.gz)` gives) is written in place: the reader gets the whole timeline."""
    fifo = tmp_path / "timeline.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        export(demo_db, fifo, "--format", "json")
    finally:
        reader.join(timeout=60)
        if reader.is_alive() and stat.S_ISFIFO(os.stat(fifo).st_mode):  # never opened for writing: release the reader
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got and json.loads(got[0])["traceEvents"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a 64 KiB tmpfs (root)")
@pytest.mark.parametrize("command, name", [("export", "run.pftrace"), ("report", "run.html")])
def test_a_full_disk_fails_and_leaves_the_old_file(command: str, name: str, demo_db: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A disk that fills up mid-write: one line, exit 2, the previous file of that name whole, nothing else left."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    try:
        (small / name).write_bytes(b"the previous report\n")
        assert main([command, "--db", str(demo_db), "-o", str(small / name)]) == 2
        err = capsys.readouterr().err
        left = sorted(p.name for p in small.iterdir())
        previous = (small / name).read_bytes()
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert err == f"ingero-mcp {command}: cannot write {small / name}: No space left on device\n"
    assert left == [name] and previous == b"the previous report\n"


def test_progress_is_told_per_batch(demo_db: Path, tmp_path: Path) -> None:
    """A long export says how far it is: the calls against their total, then the wake-ups and thread states."""
    from ingero_mcp.export.run import export_timeline

    told: list[tuple[str, int, int | None]] = []
    counts = export_timeline(demo_db, tmp_path / "run.pftrace", progress=lambda *step: told.append(step))
    stages = [stage for stage, _, _ in told]
    assert stages[0] == "calls" and "thread states" in stages and "wake-ups" in stages
    calls = [(done, total) for stage, done, total in told if stage == "calls"]
    assert calls[-1] == (counts["call_slices"] + counts["call_instants"],) * 2
    assert [d for stage, d, _ in told if stage == "thread states"][-1] == counts["state_slices"]
