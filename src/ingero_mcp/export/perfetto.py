"""The trace as a Perfetto protobuf trace (.pftrace) that ui.perfetto.dev opens.

Written against Perfetto's own Python package (`perfetto`): its generated `perfetto_trace_pb2` builds
the one-off packets (track descriptors, interned names, process events, counters, chains), and its
descriptors give every field number the column encoder (`pbcolumns`) uses for the millions of
slices. No field number is typed in here.

Layout: a process track per traced process (fork/exec/exit/rename as instants), a thread track per
traced thread (its CUDA calls as slices, args: bytes, direction, kernel, the off-CPU split), a
"state" child track per thread (running, waiting for a CPU, sleeping, IO), wake-up flows from the
waker's state track to the wakee's, host counters, and a track per causal chain holding its window.
"""

from __future__ import annotations

from typing import IO

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ingero_mcp.export import events as ev
from ingero_mcp.export import pbcolumns as col

SEQ = 1  # one writer sequence: the interned names are valid on it
TE = pb.TrackEvent
BEGIN, END, INSTANT, COUNTER = TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END, TE.TYPE_INSTANT, TE.TYPE_COUNTER
ARG_NAMES = ("bytes", "direction", "kernel", "off_cpu_ns", "sleep_ns", "cpu_wait_ns", "return_code",
             "syscall", "woken_by", "cpu_held_by", "root_cause", "seconds_lost", "severity", "chain_id",
             "filename", "child_pid", "exit_code", "old_name", "tid", "wakee_tid")
ARG = {name: i + 1 for i, name in enumerate(ARG_NAMES)}


class _Writer:
    """Packets onto one sequence: interned event names, pb2-built one-offs, column-built bulk."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.names: dict[str, int] = {}
        self.uuid = 0
        first = pb.TracePacket(trusted_packet_sequence_id=SEQ,
                               sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
        for name, iid in ARG.items():
            first.interned_data.debug_annotation_names.add(iid=iid, name=name)
        self.write(first)

    def write(self, packet: pb.TracePacket) -> None:
        self.out.write(pb.Trace(packet=[packet]).SerializeToString())

    def intern(self, names: list[str]) -> list[int]:
        """iids of event names, declaring the new ones first."""
        new = [n for n in dict.fromkeys(names) if n not in self.names]
        if new:
            p = pb.TracePacket(trusted_packet_sequence_id=SEQ,
                               sequence_flags=pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
            for n in new:
                self.names[n] = len(self.names) + 1
                p.interned_data.event_names.add(iid=self.names[n], name=n)
            self.write(p)
        return [self.names[n] for n in names]

    def track(self, **fields: object) -> int:
        self.uuid += 1
        self.write(pb.TracePacket(trusted_packet_sequence_id=SEQ,
                                  track_descriptor=pb.TrackDescriptor(uuid=self.uuid, **fields)))
        return self.uuid

    def event(self, ts: int, kind: int, track: int, name: str | None = None, args: dict | None = None,
              value: float | None = None) -> None:
        e = TE(type=kind, track_uuid=track)
        if name is not None:
            e.name_iid = self.intern([name])[0]
        for key, val in (args or {}).items():
            if val is None:
                continue
            a = e.debug_annotations.add(name_iid=ARG[key])
            if isinstance(val, str):
                a.string_value = val
            elif isinstance(val, float):
                a.double_value = val
            else:
                a.int_value = int(val)
        if value is not None:
            e.double_counter_value = value
        self.write(pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=SEQ, track_event=e,
                                  sequence_flags=pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE))

    def bulk(self, ts: np.ndarray, kind: int, tracks: np.ndarray, name_iids: np.ndarray | None = None,
             *extra: col.Seg) -> None:
        """One packet per row: a track event of `kind` on `tracks`, named, with extra TrackEvent fields."""
        n = len(ts)
        if not n:
            return
        parts = [col.field_varint(TE, "type", np.full(n, kind)), col.field_varint(TE, "track_uuid", tracks)]
        if name_iids is not None:
            parts.append(col.field_varint(TE, "name_iid", name_iids))
        self.out.write(col.packets(ts, col.concat(*parts, *extra), SEQ))


def _int(batch: pa.RecordBatch, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A column as int64 values (nulls 0) and its validity."""
    arr = batch.column(name)
    valid = np.asarray(arr.is_valid())
    return np.asarray(pc.fill_null(arr.cast(pa.int64()), 0)), valid


def _codes(batch: pa.RecordBatch, name: str, clean: bool = True) -> tuple[np.ndarray, list[str], np.ndarray]:
    """A string column as (codes, distinct strings, validity)."""
    arr = batch.column(name)
    enc = arr.dictionary_encode() if not pa.types.is_dictionary(arr.type) else arr
    strings = [ev.label(s) if clean else str(s) for s in enc.dictionary.to_pylist()]
    valid = np.asarray(enc.is_valid())
    return np.asarray(pc.fill_null(enc.indices, 0)).astype(np.int64), strings or [""], valid


def _arrow_batches(con: duckdb.DuckDBPyConnection, sql: str):
    reader = con.sql(sql).to_arrow_reader(ev.BATCH)
    yield from reader


def _lookup(tids: np.ndarray, table: dict[int, int]) -> np.ndarray:
    keys = np.array(sorted(table), dtype=np.int64)
    vals = np.array([table[k] for k in keys], dtype=np.int64)
    return vals[np.searchsorted(keys, tids)]


def write_perfetto(con: duckdb.DuckDBPyConnection, timeline: ev.Timeline, scope: ev.Scope,
                   out: IO[bytes]) -> dict[str, int]:
    """Write the timeline; returns what it wrote (tracks, slices, flows, counter points, instants, chains)."""
    w = _Writer(out)
    counts = {"process_tracks": 0, "thread_tracks": 0, "call_slices": 0, "call_instants": 0, "state_slices": 0,
              "flows": 0, "counter_points": 0, "process_events": 0, "chains": 0}
    procs: dict[int, int] = {}
    thread_track: dict[int, int] = {}
    state_track: dict[int, int] = {}
    for t in timeline.threads:
        if t.pid not in procs:
            procs[t.pid] = w.track(process=pb.ProcessDescriptor(pid=t.pid, process_name=t.process_name))
            counts["process_tracks"] += 1
        thread_track[t.tid] = w.track(parent_uuid=procs[t.pid],
                                      thread=pb.ThreadDescriptor(pid=t.pid, tid=t.tid, thread_name=t.name))
        state_track[t.tid] = w.track(parent_uuid=thread_track[t.tid], name=f"{t.name} {t.tid}: state")
        counts["thread_tracks"] += 1

    if thread_track:
        for whole in _arrow_batches(con, ev.calls_sql(scope)):
            timed = np.asarray(whole.column("duration_ns").is_valid())
            parts = [(whole, True)] if timed.all() else [(whole.filter(pa.array(timed)), True),
                                                         (whole.filter(pa.array(~timed)), False)]
            for b, slices in parts:
                if not b.num_rows:
                    continue
                ts, _ = _int(b, "ts_ns")
                dur, _ = _int(b, "duration_ns")
                tracks = _lookup(_int(b, "tid")[0], thread_track)
                ops, names, _ = _codes(b, "op")
                iids = np.array(w.intern(names), dtype=np.int64)[ops]
                args = []
                for column, arg in (("bytes", "bytes"), ("kernel_handle", "kernel"), ("off_cpu_ns", "off_cpu_ns"),
                                    ("sleep_ns", "sleep_ns"), ("cpu_wait_ns", "cpu_wait_ns")):
                    values, valid = _int(b, column)
                    args.append(col.annotation_int(ARG[arg], values, valid))
                rc, valid = _int(b, "return_code")
                args.append(col.annotation_int(ARG["return_code"], rc, valid & (rc != 0)))
                kinds, strings, valid = _codes(b, "memcpy_kind")
                args.append(col.annotation_strings(ARG["direction"], kinds, strings, valid))
                if not slices:  # entry-only calls (v4 launches): no duration, an instant, never a 0 ns slice
                    w.bulk(ts, INSTANT, tracks, iids, *args)
                    counts["call_instants"] += len(ts)
                    continue
                # ENDs first, rows in (tid, time) order: where one slice ends as the next begins (same ns), the
                # end comes first in the file, and Perfetto's sorter keeps file order for equal timestamps.
                # A 0 ns call ends 1 ns later (an end before its own begin would close its parent).
                w.bulk(ts + np.maximum(dur, 1), END, tracks)
                w.bulk(ts, BEGIN, tracks, iids, *args)
                counts["call_slices"] += len(ts)

        counts["flows"] = ev.make_wakeups(con, scope)
        for b in _arrow_batches(con, f"SELECT * FROM {ev.WAKEUPS} ORDER BY flow_id"):
            ts, _ = _int(b, "wakeup_ns")
            flow, _ = _int(b, "flow_id")
            wakee, _ = _int(b, "tid")
            w.bulk(ts, INSTANT, _lookup(_int(b, "waker_tid")[0], state_track), np.full(len(ts), w.intern(["wakes"])[0]),
                   col.annotation_int(ARG["wakee_tid"], wakee), col.field_fixed64(TE, "flow_ids", flow))
        for b in _arrow_batches(con, ev.woken_sql()):
            ts, _ = _int(b, "wakeup_ns")
            flow, _ = _int(b, "flow_id")
            w.bulk(ts, INSTANT, _lookup(_int(b, "tid")[0], state_track), np.full(len(ts), w.intern(["woken"])[0]),
                   col.field_fixed64(TE, "terminating_flow_ids", flow))
        for b in _arrow_batches(con, ev.states_sql(scope)):
            ts, _ = _int(b, "start_ns")
            dur, _ = _int(b, "dur_ns")
            tracks = _lookup(_int(b, "tid")[0], state_track)
            states, names, _ = _codes(b, "state", clean=False)
            iids = np.array(w.intern([ev.state_name(s) for s in names]), dtype=np.int64)[states]
            args = [col.annotation_strings(ARG[arg], *_codes(b, column))
                    for column, arg in (("syscall", "syscall"), ("waker_comm", "woken_by"),
                                        ("holder_comm", "cpu_held_by"))]
            flow, valid = _int(b, "flow_id")
            args.append(col.field_fixed64(TE, "terminating_flow_ids", flow, valid))
            w.bulk(ts + np.maximum(dur, 1), END, tracks)  # ends first: see the calls above
            w.bulk(ts, BEGIN, tracks, iids, *args)
            counts["state_slices"] += len(ts)

    for ts, event, pid, tid, child, comm, filename, code, old in ev.batches_flat(con, ev.process_events_sql(scope)):
        track = procs.get(pid)
        if track is None:
            procs[pid] = track = w.track(
                process=pb.ProcessDescriptor(pid=pid, process_name=ev.label(comm or f"pid {pid}")))
            counts["process_tracks"] += 1
        w.event(ts, INSTANT, track, f"{ev.label(event, 20)} {ev.label(comm, 60)}".strip(),
                {"filename": ev.label(filename) if filename else None, "child_pid": child, "exit_code": code,
                 "old_name": ev.label(old) if old else None, "tid": tid})
        counts["process_events"] += 1

    for column, name in ev.COUNTERS:
        track = None
        for ts, value in ev.batches_flat(con, ev.counters_sql(scope, column)):
            if track is None:
                track = w.track(name=name, counter=pb.CounterDescriptor())
            w.event(ts, COUNTER, track, value=float(value))
            counts["counter_points"] += 1

    chains = [c for c in timeline.chains if c.window is not None]
    if chains:
        parent = w.track(name="causal chains")
        for chain in chains:
            track = w.track(parent_uuid=parent, name=ev.label(f"{chain.severity} {chain.id}", 80))
            w.event(chain.window.start_ns, BEGIN, track, ev.label(chain.summary, 200),
                    {"root_cause": ev.label(chain.root_cause, 500), "seconds_lost": chain.seconds_lost,
                     "severity": chain.severity, "chain_id": ev.label(chain.id)})
            w.event(max(chain.window.end_ns, chain.window.start_ns + 1), END, track)
            counts["chains"] += 1
    return counts
