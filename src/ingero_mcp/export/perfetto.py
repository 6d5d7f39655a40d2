"""The trace as a Perfetto protobuf trace (.pftrace) that ui.perfetto.dev opens, streamed in bounded memory.

Written against Perfetto's own Python package (`perfetto`): its generated `perfetto_trace_pb2` builds
the one-off packets (track descriptors, interned names, process events, counters, chains), and its
descriptors give every field number the column encoder (`pbcolumns`) uses for the millions of
slices. No field number is typed in here.

Layout: a process track per traced process (fork/exec/exit/rename as instants), a thread track per
traced thread (its CUDA calls as slices, args: bytes, direction, kernel (the store's kernel_key), the
off-CPU split, which a call never off CPU leaves out: on a call slice, no `off_cpu_ns` is 0 ns, and a
split the trace cannot tell is `off_cpu: unknown`; its on-CPU stack samples), a "state" child track
per thread holding what the store holds, its off-CPU spans (waiting for a CPU, sleeping, IO; a gap
between two is the thread running: as slices they were 44% of the states' packets), wake-up flows
from the waker's state track to the wakee's, host counters, and a track per causal chain holding its
window.

Compact: the bulk of a track goes on a writer sequence of its own whose `TracePacketDefaults` name
the track (no track_uuid per event) and an incremental sequence clock (a packet's timestamp is the
ns since the previous packet of its sequence, 2-3 bytes instead of 9; trace_processor adds them
up), each slice's END right after its BEGIN (the END's delta is the slice's duration, and a thread state's
BEGIN is 0 ns after the END before it: 1 byte), and every name and string arg is interned once per sequence
(`InternedData`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ingero_mcp.export import events as ev
from ingero_mcp.export import pbcolumns as col
from ingero_mcp.export import samples as sm

if TYPE_CHECKING:
    from ingero_mcp.export.calls_apart import CallsApart

MISC = 1  # the sequence of the one-off packets (absolute timestamps); each bulk track's sequence follows
CLOCK = 64  # a sequence-scoped clock (64..127), incremental: see the module's docstring
TE, DA = pb.TrackEvent, pb.DebugAnnotation
BEGIN, END, INSTANT, COUNTER = TE.TYPE_SLICE_BEGIN, TE.TYPE_SLICE_END, TE.TYPE_INSTANT, TE.TYPE_COUNTER
ARG_NAMES = ("bytes", "direction", "kernel", "off_cpu_ns", "sleep_ns", "cpu_wait_ns", "return_code",
             "syscall", "woken_by", "cpu_held_by", "root_cause", "seconds_lost", "severity", "chain_id",
             "filename", "child_pid", "exit_code", "old_name", "tid", "wakee_tid", "off_cpu")
ARG = {name: i + 1 for i, name in enumerate(ARG_NAMES)}
END_BODY = pb.TracePacket(track_event=TE(type=END)).SerializeToString()  # an END packet's fields after its time
CHUNK = 8_192  # rows encoded at once: the buffer and columns stay in cache (8k rows: fastest of 2k-128k)
Progress = Callable[[str, int, int | None], None]


@dataclass
class Rows:
    """Rows of one packet shape for `_Writer.bulk`: their times and sequences, columns, and `build`, which makes
    the TracePacket's other fields from (a slice of) the columns; interned: (iid column, presence column or None,
    InternedData field number) to declare first. ends: a slice's END time per row, its END packet right after the
    row's BEGIN in the file (None: no ENDs); ended: the rows that have one (None: all)."""

    ts: np.ndarray
    seqs: np.ndarray
    cols: dict[str, np.ndarray]
    build: Callable[[dict[str, np.ndarray]], list[col.Field]]
    interned: tuple[tuple[str, str | None, int], ...] = ()
    ends: np.ndarray | None = None
    ended: np.ndarray | None = None


class _Writer:
    """Packets: one-offs on the MISC sequence (pb2), bulk rows column-encoded on their track's own sequence."""

    def __init__(self, out: IO[bytes], origin: int, seq_of: dict[int, int], misc: bool = True) -> None:
        self.out, self.origin = out, origin
        self.names: dict[str, int] = {}  # event names -> iid (the same iid on every sequence)
        self.strings: dict[str, int] = {}  # debug annotation string values -> iid
        rows = len(seq_of) + 3  # every sequence: MISC, samples', one per bulk track
        self.declared = {2: np.zeros((rows, 64), dtype=bool), 29: np.zeros((rows, 64), dtype=bool)}  # [seq, iid]
        self.uuid = 0
        self.seq_of = seq_of  # track uuid -> its sequence (assigned before the tracks, busiest first)
        self.opened: set[int] = set()
        self.last = np.zeros(len(seq_of) + 3, dtype=np.int64)  # per sequence: the last timestamp written
        if not misc:  # a second process's writer (calls_apart): the MISC sequence is the first process's
            return
        first = pb.TracePacket(trusted_packet_sequence_id=MISC,
                               sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
        for name, iid in ARG.items():
            first.interned_data.debug_annotation_names.add(iid=iid, name=name)
        self.write(first)

    def write(self, packet: pb.TracePacket) -> None:
        self.out.write(pb.Trace(packet=[packet]).SerializeToString())

    def intern(self, names: list[str]) -> list[int]:
        """iids of event names (declared on a sequence when first used there)."""
        return [self.names.setdefault(n, len(self.names) + 1) for n in names]

    def string_iids(self, strings: list[str]) -> np.ndarray:
        return np.array([self.strings.setdefault(s, len(self.strings) + 1) for s in strings], dtype=np.int64)

    def track(self, **fields: object) -> int:
        self.uuid += 1
        self.write(pb.TracePacket(trusted_packet_sequence_id=MISC,
                                  track_descriptor=pb.TrackDescriptor(uuid=self.uuid, **fields)))
        return self.uuid

    def event(self, ts: int, kind: int, track: int, name: str | None = None, args: dict | None = None,
              value: float | None = None) -> None:
        """One track event on the MISC sequence (absolute timestamp)."""
        e = TE(type=kind, track_uuid=track)
        if name is not None:
            e.name_iid = self.intern([name])[0]
            self._declare(np.array([MISC]), np.array([e.name_iid]), 2)
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
        self.write(pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=MISC, track_event=e))

    def open(self, seq: int, track: int | None) -> None:
        """A bulk sequence's first packets: state cleared, its defaults (track, clock), the arg names, its clock."""
        first = pb.TracePacket(trusted_packet_sequence_id=seq,
                               sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED,
                               trace_packet_defaults=pb.TracePacketDefaults(timestamp_clock_id=CLOCK))
        if track is not None:
            first.trace_packet_defaults.track_event_defaults.track_uuid = track
        for name, iid in ARG.items():
            first.interned_data.debug_annotation_names.add(iid=iid, name=name)
        self.write(first)
        self.write(pb.TracePacket(trusted_packet_sequence_id=seq, clock_snapshot=pb.ClockSnapshot(clocks=[
            pb.ClockSnapshot.Clock(clock_id=pb.BUILTIN_CLOCK_BOOTTIME, timestamp=self.origin),
            pb.ClockSnapshot.Clock(clock_id=CLOCK, timestamp=self.origin, is_incremental=True)])))
        self.last[seq] = self.origin
        self.opened.add(seq)

    def _declare(self, seqs: np.ndarray, iids: np.ndarray, field: int) -> None:
        """Declare on each sequence the interned names (field 2) or string values (29) it is about to use."""
        seen = self.declared[field]
        width = int(iids.max(initial=0)) + 1
        if seen.shape[1] < width:  # only the iids grow (the sequences are all known): doubled, so rarely
            grown = np.zeros((seen.shape[0], max(width, 2 * seen.shape[1])), dtype=bool)
            grown[:, :seen.shape[1]] = seen
            self.declared[field] = seen = grown
        width = seen.shape[1]
        keys = seqs * width + iids
        if len(keys) > 1:
            keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]  # runs of one pair: checked once
        keys = keys[~seen.ravel()[keys]]
        if not len(keys):
            return
        used = np.unique(keys)  # the new (sequence, iid) pairs: few
        table = {v: k for k, v in (self.names if field == 2 else self.strings).items()}
        packets: dict[int, pb.TracePacket] = {}
        for seq, iid in zip((used // width).tolist(), (used % width).tolist()):
            p = packets.setdefault(seq, pb.TracePacket(trusted_packet_sequence_id=seq))
            if field == 2:
                p.interned_data.event_names.add(iid=iid, name=table[iid])
            else:
                p.interned_data.debug_annotation_string_values.add(iid=iid, str=table[iid].encode())
            seen[seq, iid] = True
        for p in packets.values():
            self.write(p)

    def bulk(self, r: Rows) -> None:
        """Rows as packets on their sequences in the order given (a row's END right after its BEGIN), each timestamp
        the ns since the previous packet on its sequence; encoded CHUNK rows at a time (cache-sized)."""
        if not len(r.ts):
            return
        runs = r.seqs[np.concatenate([[True], r.seqs[1:] != r.seqs[:-1]])]
        for seq in np.unique(runs):
            if int(seq) not in self.opened:
                self.open(int(seq), self.track_of.get(int(seq)))
        begin_delta, end_delta = self._slice_deltas(r)
        for column, present, field in r.interned:
            keep = slice(None) if present is None else r.cols[present]
            self._declare(r.seqs[keep], r.cols[column][keep], field)
        for a in range(0, len(r.ts), CHUNK):
            rows = slice(a, min(a + CHUNK, len(r.ts)))
            packets = [col.message(pb.Trace, "packet", [
                col.varint(pb.TracePacket, "timestamp", begin_delta[rows]),
                col.varint(pb.TracePacket, "trusted_packet_sequence_id", r.seqs[rows]),
                *r.build({k: v[rows] for k, v in r.cols.items()})])]
            if end_delta is not None:
                packets.append(col.message(pb.Trace, "packet", [
                    col.varint(pb.TracePacket, "timestamp", end_delta[rows]),
                    col.varint(pb.TracePacket, "trusted_packet_sequence_id", r.seqs[rows]), col.const(END_BODY)],
                    None if r.ended is None else r.ended[rows]))
            self.out.write(col.encode(packets, rows.stop - a))

    def _slice_deltas(self, r: Rows) -> tuple[np.ndarray, np.ndarray | None]:
        """The BEGINs' (or instants') and the ENDs' timestamp deltas, in file order: BEGIN, its END, next BEGIN. A
        state's BEGIN is then 0 ns after the END before it (1 byte) and an END its duration, not a period."""
        if r.ends is None:
            return self._deltas(r.ts, r.seqs), None
        n = len(r.ts)
        times = np.stack([r.ts, r.ends], axis=1)
        if r.ended is None or r.ended.all():  # every row a slice (states; calls but v4 launches): no masks
            both = self._deltas(times.ravel(), np.repeat(r.seqs, 2)).reshape(n, 2)
            return both[:, 0], both[:, 1]
        keep = np.ones((n, 2), dtype=bool)
        keep[:, 1] = r.ended
        both = np.zeros((n, 2), dtype=np.int64)
        both[keep] = self._deltas(times[keep], np.repeat(r.seqs, 2)[keep.ravel()])
        return both[:, 0], both[:, 1]

    def _deltas(self, ts: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """Each row's time less the previous row's on its sequence (the sequence's last before these rows)."""
        n = len(ts)
        runs = np.flatnonzero(np.concatenate([[True], seqs[1:] != seqs[:-1]]))
        grouped = np.bincount(seqs[runs]).max() == 1  # each sequence's rows already together (calls, states)
        order = None if grouped else np.argsort(seqs.astype(np.uint32), kind="stable")
        ts_g, seq_g = (ts, seqs) if order is None else (ts[order], seqs[order])
        first = np.ones(n, dtype=bool)
        first[1:] = seq_g[1:] != seq_g[:-1]
        prev = np.empty(n, dtype=np.int64)
        prev[1:] = ts_g[:-1]
        prev[first] = self.last[seq_g[first]]
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        self.last[seq_g[last]] = ts_g[last]
        if order is None:
            return ts_g - prev
        delta = np.empty(n, dtype=np.int64)
        delta[order] = ts_g - prev
        return delta

    @property
    def track_of(self) -> dict[int, int]:
        if not hasattr(self, "_track_of"):
            self._track_of = {s: t for t, s in self.seq_of.items()}
        return self._track_of


def _int(batch: pa.RecordBatch, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A column as int64 values (nulls 0) and its validity."""
    arr = batch.column(name)
    if arr.type != pa.int64():
        arr = arr.cast(pa.int64())
    if not arr.null_count:  # most columns: read in place, no copy
        return np.asarray(arr), np.ones(len(arr), dtype=bool)
    return np.asarray(pc.fill_null(arr, 0)), np.asarray(arr.is_valid())


def _codes(batch: pa.RecordBatch, name: str, clean: bool = True) -> tuple[np.ndarray, list[str], np.ndarray]:
    """A string column as (codes, distinct strings, validity)."""
    arr = batch.column(name)
    enc = arr.dictionary_encode() if not pa.types.is_dictionary(arr.type) else arr
    strings = [ev.label(s) if clean else str(s) for s in enc.dictionary.to_pylist()]
    valid = np.asarray(enc.is_valid())
    return np.asarray(pc.fill_null(enc.indices, 0)).astype(np.int64), strings or [""], valid


def _arrow_batches(con: duckdb.DuckDBPyConnection, sql: str) -> Iterator[pa.RecordBatch]:
    yield from con.sql(sql).to_arrow_reader(ev.BATCH)


def _lookup(keys_of: dict[int, int], tids: np.ndarray) -> np.ndarray:
    keys = np.array(sorted(keys_of), dtype=np.int64)
    vals = np.array([keys_of[k] for k in keys], dtype=np.int64)
    return vals[np.searchsorted(keys, tids)]


def _type(kinds: np.ndarray) -> col.Field:
    return col.varint(TE, "type", kinds)


def _name(iids: np.ndarray, present: np.ndarray) -> col.Field:
    return col.varint(TE, "name_iid", iids, present)


def _arg_int(name: str, values: np.ndarray, present: np.ndarray) -> col.Field:
    """A debug annotation {name_iid, int_value}."""
    return col.message(TE, "debug_annotations", [col.const(col.tag(DA, "name_iid", col.VARINT)
                                                           + col.varint_bytes(ARG[name])),
                                                 col.varint(DA, "int_value", values)], present)


def _arg_str(name: str, iids: np.ndarray, present: np.ndarray) -> col.Field:
    """A debug annotation {name_iid, string_value_iid} (the string interned on the sequence)."""
    return col.message(TE, "debug_annotations", [col.const(col.tag(DA, "name_iid", col.VARINT)
                                                           + col.varint_bytes(ARG[name])),
                                                 col.varint(DA, "string_value_iid", iids)], present)


def _event(fields: list[col.Field]) -> list[col.Field]:
    return [col.message(pb.TracePacket, "track_event", fields)]


def _end_times(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Slices' END times: a 0 ns slice ends 1 ns later (an end before its own begin would close its parent). Each
    END follows its BEGIN in the file and a track's rows come in time order, so where one slice ends as the next
    begins (same ns) the end is first in the file, and Perfetto's sorter keeps file order for equal times."""
    return ts + np.maximum(dur, 1)


def write_perfetto(con: duckdb.DuckDBPyConnection, timeline: ev.Timeline, scope: ev.Scope,
                   out: IO[bytes], progress: Progress | None = None, apart: CallsApart | None = None) -> dict[str, int]:
    """Write the timeline; returns what it wrote (tracks, slices, flows, counter points, instants, chains). apart: a
    second process that encodes the calls meanwhile (`calls_apart.start`; its part appended last); None: here."""
    from ingero_mcp.analysis import window_or_trace

    tell = progress or (lambda stage, done, total: None)
    counts = {"process_tracks": 0, "thread_tracks": 0, "call_slices": 0, "call_instants": 0, "state_slices": 0,
              "flows": 0, "counter_points": 0, "process_events": 0, "chains": 0, "stack_samples": 0}
    # Sequences, busiest first (a sequence id under 128 is one byte): each thread's and state track's own.
    calls_of = dict(ev.rows(con, f"SELECT tid, count(*) FROM cuda_calls {scope.calls()} GROUP BY tid"))
    offs_of = dict(ev.rows(con, f"SELECT tid, count(*) FROM sched_intervals {scope.intervals()} GROUP BY tid"))
    # Track uuids are laid out as below: per thread (after its process's), the thread's then its state track's.
    uuid, planned, pids = 0, [], set()
    for t in timeline.threads:
        if t.pid not in pids:
            pids.add(t.pid)
            uuid += 1
        planned += [(calls_of.get(t.tid, 0), uuid + 1), (2 * offs_of.get(t.tid, 0), uuid + 2)]
        uuid += 2
    seq_of = {track: MISC + 2 + i for i, (_, track) in enumerate(sorted(planned, key=lambda p: -p[0]))}
    w = _Writer(out, window_or_trace(con, scope.window).start_ns, seq_of)
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
    assert set(seq_of) == set(thread_track.values()) | set(state_track.values()), "tracks laid out as planned"
    thread_seq = {tid: seq_of[track] for tid, track in thread_track.items()}
    state_seq = {tid: seq_of[track] for tid, track in state_track.items()}

    if thread_track:
        if apart is None:
            _calls(con, w, scope, thread_seq, counts, tell)
        else:
            apart.send(scope, thread_seq, seq_of, w.origin)
        counts["flows"] = ev.make_wakeups(con, scope)
        states = _state_columns(con, w, scope, state_seq)
        _wakeups(con, w, scope, state_seq, _flows_ended(states, scope, counts["flows"]), counts, tell)
        _states(w, states, counts, tell)
    _samples(con, w, scope, counts, tell)
    _one_offs(con, w, timeline, scope, procs, counts)
    if apart is not None and thread_track:
        apart.finish(out, counts, tell)
    return counts


def _calls(con: duckdb.DuckDBPyConnection, w: _Writer, scope: ev.Scope, thread_seq: dict[int, int],
           counts: dict[str, int], tell: Progress) -> None:
    """CUDA calls: a slice per timed call, an instant per entry-only one (v4 launches: no duration, never 0 ns)."""
    total = int(ev.rows(con, f"SELECT count(*) FROM cuda_calls {scope.calls()}")[0][0])
    done = 0
    # The kernel as text: v10 stores it (kernel_key); an older store's number cast (no per-row cast where stored).
    kernel = ("kernel_key" if "kernel_key" in con.sql("SELECT * FROM cuda_calls LIMIT 0").columns
              else "CAST(kernel_handle AS VARCHAR)")
    for b in _arrow_batches(con, ev.calls_sql(scope, sort=not ev.calls_in_time_order(con, scope), kernel=kernel)):
        ts, _ = _int(b, "ts_ns")
        dur, timed = _int(b, "duration_ns")
        ops, names, _ = _codes(b, "op")
        seqs = _lookup(thread_seq, _int(b, "tid")[0])
        cols = {"kind": np.where(timed, BEGIN, INSTANT), "name": np.array(w.intern(names), dtype=np.int64)[ops]}
        for column in ("bytes", "off_cpu_ns", "sleep_ns", "cpu_wait_ns", "return_code"):
            cols[column], cols[column + "?"] = _int(b, column)
        cols["return_code?"] &= cols["return_code"] != 0
        # A call slice never off CPU (99.6% of a 10M-event demo's) carries no split at all (18 B a call fewer): on a
        # slice, no off_cpu_ns means 0 ns. Unknown is not zero: a slice whose row has no off_cpu_ns says
        # `off_cpu: unknown` (none in today's recordings; an entry-only launch, an instant, has no span to split).
        never_off = (cols["off_cpu_ns?"] & cols["sleep_ns?"] & cols["cpu_wait_ns?"] & (cols["off_cpu_ns"] == 0)
                     & (cols["sleep_ns"] == 0) & (cols["cpu_wait_ns"] == 0))
        for column in ("off_cpu_ns", "sleep_ns", "cpu_wait_ns"):
            cols[column + "?"] &= ~never_off
        cols["off_cpu?"] = timed & ~never_off & ~cols["off_cpu_ns?"]
        cols["off_cpu"] = np.full(len(ts), w.string_iids(["unknown"])[0])
        kind_codes, strings, valid = _codes(b, "memcpy_kind")
        cols["direction"], cols["direction?"] = w.string_iids(strings)[kind_codes], valid
        # A launch's kernel as the stored text, interned: 40 kernels launched 6.8M times cost ~7 B a launch as a
        # string iid, 12 B as the handle's varint (the digits are the store's kernel_key, kernel_handle's source).
        kernel_codes, strings, valid = _codes(b, "kernel", clean=False)
        cols["kernel"], cols["kernel?"] = w.string_iids(strings)[kernel_codes], valid

        def build(c: dict[str, np.ndarray]) -> list[col.Field]:
            return _event([_type(c["kind"]), _name(c["name"], None),
                           *(_arg_int(arg, c[arg], c[arg + "?"])
                             for arg in ("bytes", "off_cpu_ns", "sleep_ns", "cpu_wait_ns", "return_code")),
                           *(_arg_str(arg, c[arg], c[arg + "?"]) for arg in ("kernel", "direction", "off_cpu"))])

        w.bulk(Rows(ts, seqs, cols, build, (("name", None, 2), ("direction", "direction?", 29),
                                            ("kernel", "kernel?", 29), ("off_cpu", "off_cpu?", 29)),
                    _end_times(ts, dur), timed))
        counts["call_slices"] += int(timed.sum())
        counts["call_instants"] += int((~timed).sum())
        done += len(ts)
        tell("calls", done, total)


def _flows_ended(states: dict[str, np.ndarray], scope: ev.Scope, flows: int) -> np.ndarray | None:
    """Per flow id, whether a CPU-wait state read ends it; None where the states read are not all of thread_state's
    (a window or pids: a CPU wait outside them still ends its arrow, which woken_sql finds)."""
    if scope.window is not None or scope.pids is not None:
        return None
    ended = np.zeros(flows + 1, dtype=bool)
    ended[states["flow"][states["flow?"]]] = True
    return ended


def _wakeups(con: duckdb.DuckDBPyConnection, w: _Writer, scope: ev.Scope, state_seq: dict[int, int],
             ended: np.ndarray | None, counts: dict[str, int], tell: Progress) -> None:
    """Wake-up arrows: 'wakes' on the waker's state track, 'woken' on the wakee's where no CPU wait ends it (from
    `ended` where given: woken_sql's anti-join over thread_state took ~0.8 s at 10M events)."""
    wakes, woken = w.intern(["wakes", "woken"])
    head = {name: col.const(TE(type=INSTANT, name_iid=iid).SerializeToString()) for name, iid in (("wakes", wakes),
                                                                                                 ("woken", woken))}
    done, loose = 0, []
    for b in _arrow_batches(con, f"SELECT * FROM {ev.WAKEUPS} ORDER BY flow_id"):
        ts, _ = _int(b, "wakeup_ns")
        n = len(ts)
        cols = {"flow": _int(b, "flow_id")[0], "wakee": _int(b, "tid")[0], "name": np.full(n, wakes)}
        w.bulk(Rows(ts, _lookup(state_seq, _int(b, "waker_tid")[0]), cols,
                    lambda c: _event([head["wakes"], _arg_int("wakee_tid", c["wakee"], None),
                                      col.fixed64(TE, "flow_ids", c["flow"])]), (("name", None, 2),)))
        if ended is not None:
            keep = ~ended[cols["flow"]]
            loose.append((ts[keep], cols["wakee"][keep], cols["flow"][keep]))
        done += n
        tell("wake-ups", done, counts["flows"])
    if ended is None:
        loose = [(_int(b, "wakeup_ns")[0], _int(b, "tid")[0], _int(b, "flow_id")[0])
                 for b in _arrow_batches(con, ev.woken_sql())]
    for ts, tid, flow in loose:
        w.bulk(Rows(ts, _lookup(state_seq, tid), {"flow": flow, "name": np.full(len(ts), woken)},
                    lambda c: _event([head["woken"], col.fixed64(TE, "terminating_flow_ids", c["flow"])]),
                    (("name", None, 2),)))


STATE_STRINGS = (("syscall", "syscall"), ("waker_comm", "woken_by"), ("holder_comm", "cpu_held_by"))  # column, arg


def _states(w: _Writer, cols: dict[str, np.ndarray], counts: dict[str, int], tell: Progress) -> None:
    """Thread states (`_state_columns`): one slice each on the state track, the wake-up arrow ending on a CPU wait."""
    begin = col.const(TE(type=BEGIN).SerializeToString())
    order = _track_time_order(cols["seq"], cols["ts"])

    def build(c: dict[str, np.ndarray]) -> list[col.Field]:
        args = [_arg_str(arg, c[column], c[column + "?"]) for column, arg in STATE_STRINGS]
        return _event([begin, _name(c["name"], None), *args,
                       col.fixed64(TE, "terminating_flow_ids", c["flow"], c["flow?"])])

    for a in range(0, len(order), ev.BATCH):
        c = {k: v[order[a:a + ev.BATCH]] for k, v in cols.items()}
        w.bulk(Rows(c["ts"], c["seq"], c, build, (("name", None, 2), *((column, column + "?", 29)
                                                                        for column, _ in STATE_STRINGS)),
                    _end_times(c["ts"], c["dur"])))
        counts["state_slices"] += len(c["ts"])
        tell("thread states", counts["state_slices"], None)


def _state_columns(con: duckdb.DuckDBPyConnection, w: _Writer, scope: ev.Scope,
                   state_seq: dict[int, int]) -> dict[str, np.ndarray]:
    """Every thread state in scope as columns (times, sequence, name and string iids, flow), in the query's own
    order: DuckDB's ORDER BY of these wide rows with their strings took 2-3 s at the export's memory cap, the
    numpy sort after it ~0.1 s. Held whole (~50 B a state), as integers only, each batch copied straight into
    arrays sized for the most states the intervals make (2 each: the sleep and the CPU wait;
    memory never written is never taken), not gathered in parts and joined (a second copy: ~1 s at 10M)."""
    room = 2 * int(ev.rows(con, "SELECT count(*) FROM sched_intervals")[0][0])
    cols: dict[str, np.ndarray] = {}
    n = 0
    for b in _arrow_batches(con, ev.states_sql(scope, sort=False)):
        states, names, _ = _codes(b, "state", clean=False)
        got = {"ts": _int(b, "start_ns")[0], "dur": _int(b, "dur_ns")[0],
               "seq": _lookup(state_seq, _int(b, "tid")[0]).astype(np.int32),
               "name": np.array(w.intern([ev.state_name(s) for s in names]), dtype=np.int32)[states]}
        for column, _ in STATE_STRINGS:
            codes, strings, valid = _codes(b, column)
            got[column], got[column + "?"] = w.string_iids(strings).astype(np.int32)[codes], valid
        got["flow"], got["flow?"] = _int(b, "flow_id")
        if n + len(b) > room:  # more than the bound (a thread_state that grew): doubled
            room = 2 * (n + len(b))
            cols = {k: np.concatenate([v[:n], np.empty(room - n, dtype=v.dtype)]) for k, v in cols.items()}
        for k, v in got.items():
            cols.setdefault(k, np.empty(room, dtype=v.dtype))[n:n + len(b)] = v
        n += len(b)
    if not cols:
        return {"ts": np.zeros(0, dtype=np.int64), "seq": np.zeros(0, dtype=np.int32),
                "flow": np.zeros(0, dtype=np.int64), "flow?": np.zeros(0, dtype=bool)}
    return {k: v[:n] for k, v in cols.items()}


def _track_time_order(seqs: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Rows ordered by (sequence, time), ties in their order: one int64 key and a stable sort (timsort: the
    query's rows come in a few runs already in order) where the times span < 2^47 ns (39 h), else lexsort."""
    if not len(ts):
        return np.zeros(0, dtype=np.int64)
    low = int(ts.min())
    if int(ts.max()) - low < 1 << 47 and int(seqs.max()) < 1 << 16:
        return np.argsort((seqs.astype(np.int64) << 47) | (ts - low), kind="stable")
    return np.lexsort((ts, seqs))


def _samples(con: duckdb.DuckDBPyConnection, w: _Writer, scope: ev.Scope, counts: dict[str, int],
             tell: Progress) -> None:
    """On-CPU stack samples (v6) as PerfSamples on a sequence of their own, which interns their stacks."""
    if not ev.rows(con, f"SELECT count(*) FROM stack_samples {scope.moments()}")[0][0]:
        return
    seq = MISC + 1
    w.open(seq, None)
    w.write(pb.TracePacket(trusted_packet_sequence_id=seq, interned_data=sm.interned_stacks(con, scope)))
    ps = pb.PerfSample
    for b in _arrow_batches(con, sm.samples_sql(scope)):
        ts, _ = _int(b, "ts_ns")
        cols = {"pid": _int(b, "pid")[0], "tid": _int(b, "tid")[0]}
        cols["cpu"], cols["cpu?"] = _int(b, "cpu")
        cols["stack"], cols["stack?"] = _int(b, "callstack")
        w.bulk(Rows(ts, np.full(len(ts), seq), cols, lambda c: [col.message(pb.TracePacket, "perf_sample", [
            col.varint(ps, "cpu", c["cpu"], c["cpu?"]), col.varint(ps, "pid", c["pid"]),
            col.varint(ps, "tid", c["tid"]), col.varint(ps, "callstack_iid", c["stack"], c["stack?"])])]))
        counts["stack_samples"] += len(ts)
        tell("stack samples", counts["stack_samples"], None)


def _one_offs(con: duckdb.DuckDBPyConnection, w: _Writer, timeline: ev.Timeline, scope: ev.Scope,
              procs: dict[int, int], counts: dict[str, int]) -> None:
    """Process events, host counters and the causal chains: few, built with pb2 on the MISC sequence."""
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
