"""Column-at-a-time protobuf encoding of many TracePackets of one shape (numpy, no Python loop per row).

Perfetto's Python package builds one message object per packet: about 10 us each, 200+ s for a
10M-event trace. The timeline's bulk (call and state slices, their ends, wake-up instants) is a few
packet shapes repeated millions of times, so it is encoded here a column at a time: every field
number comes from Perfetto's own descriptors (`perfetto_trace_pb2`), never typed in, and the tests
decode every packet back with those same generated classes. Small, one-off packets (track
descriptors, interned names) are still built with `perfetto_trace_pb2`.

A column of rows is a `Seg`: per row, a byte string (empty: the field is absent in that row, as
protobuf allows), kept as padded parts until the packets are written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from google.protobuf.descriptor import FieldDescriptor as _F

VARINT, FIXED64, LEN = 0, 1, 2
_VARINT_TYPES = {_F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_UINT32, _F.TYPE_UINT64, _F.TYPE_ENUM, _F.TYPE_BOOL}


def field_number(message: type, name: str) -> int:
    """A field's number, read from Perfetto's generated descriptor."""
    return message.DESCRIPTOR.fields_by_name[name].number


def tag(message: type, name: str, wire: int) -> bytes:
    """The key bytes of a field (number from the descriptor, wire type checked against its declared type)."""
    declared = message.DESCRIPTOR.fields_by_name[name].type
    expected = {VARINT: _VARINT_TYPES, FIXED64: {_F.TYPE_FIXED64, _F.TYPE_SFIXED64, _F.TYPE_DOUBLE},
                LEN: {_F.TYPE_MESSAGE, _F.TYPE_STRING, _F.TYPE_BYTES}}[wire]
    if declared not in expected:
        raise TypeError(f"{message.DESCRIPTOR.name}.{name} is not wire type {wire}")
    return varint_bytes((field_number(message, name) << 3) | wire)


def varint_bytes(value: int) -> bytes:
    """One varint (two's complement for a negative int64, as protobuf writes it)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


@dataclass
class Seg:
    """A column of byte strings, one per row, kept as padded parts: row i is, for each part, the first
    lengths[i] bytes of that part's row i. Concatenation only lists parts; `bytes_of` moves the bytes once."""

    parts: list[tuple[np.ndarray, np.ndarray]]  # (uint8 matrix n x width, int64 lengths n)
    n: int

    @property
    def lengths(self) -> np.ndarray:
        return sum((lengths for _, lengths in self.parts), np.zeros(self.n, dtype=np.int64))


def bytes_of(seg: Seg) -> np.ndarray:
    """The rows' bytes back to back (one masked copy of all parts side by side)."""
    mats = [np.broadcast_to(m, (seg.n, m.shape[1])) for m, _ in seg.parts]
    masks = [np.arange(m.shape[1])[None, :] < lengths[:, None] for m, lengths in seg.parts]
    return np.hstack(mats)[np.hstack(masks)]


def varints(values: np.ndarray, present: np.ndarray | None = None) -> Seg:
    """Each value as a varint (absent rows: length 0); negative values as 10-byte two's complement."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    n = len(v)
    top = int(v.max()) if n else 0
    width = max(1, (top.bit_length() + 6) // 7)
    nbytes = np.ones(n, dtype=np.int64)
    for k in range(1, width):
        nbytes += v >= np.uint64(1 << (7 * k))
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    mat = ((v[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    mat |= ((np.arange(width)[None, :] < (nbytes[:, None] - 1)).astype(np.uint8) << 7)
    if present is not None:
        nbytes = np.where(present, nbytes, 0)
    return Seg([(mat, nbytes)], n)


def const(blob: bytes, n: int, present: np.ndarray | None = None) -> Seg:
    """The same bytes in every (present) row."""
    mat = np.frombuffer(blob, dtype=np.uint8)[None, :]
    lengths = np.full(n, len(blob), dtype=np.int64)
    if present is not None:
        lengths = np.where(present, lengths, 0)
    return Seg([(mat, lengths)], n)


def choose(codes: np.ndarray, table: list[bytes], present: np.ndarray | None = None) -> Seg:
    """Row i holds table[codes[i]] (absent rows: nothing)."""
    width = max(1, max(len(t) for t in table))
    tab = np.zeros((len(table), width), dtype=np.uint8)
    for i, t in enumerate(table):
        tab[i, :len(t)] = np.frombuffer(t, dtype=np.uint8)
    tlen = np.array([len(t) for t in table], dtype=np.int64)
    codes = np.asarray(codes, dtype=np.int64)
    lengths = tlen[codes]
    if present is not None:
        lengths = np.where(present, lengths, 0)
    return Seg([(tab[codes], lengths)], len(codes))


def concat(*segs: Seg) -> Seg:
    """Row-wise concatenation: row i is seg1's row i, then seg2's, ..."""
    return Seg([part for s in segs for part in s.parts], segs[0].n)


def field_varint(message: type, name: str, values: np.ndarray, present: np.ndarray | None = None) -> Seg:
    """A varint field per row."""
    n = len(values)
    key = const(tag(message, name, VARINT), n, present)
    return concat(key, varints(values, present))


def field_fixed64(message: type, name: str, values: np.ndarray, present: np.ndarray | None = None) -> Seg:
    """A fixed64 field per row (little-endian, as protobuf writes it)."""
    n = len(values)
    raw = np.ascontiguousarray(np.asarray(values).astype("<u8")).view(np.uint8).reshape(n, 8)
    lengths = np.full(n, 8, dtype=np.int64) if present is None else np.where(present, 8, 0).astype(np.int64)
    return concat(const(tag(message, name, FIXED64), n, present), Seg([(raw, lengths)], n))


def field_message(message: type, name: str, body: Seg, present: np.ndarray | None = None) -> Seg:
    """A length-delimited field holding each row's body."""
    n = body.n
    return concat(const(tag(message, name, LEN), n, present), varints(body.lengths, present), body)


def annotation_int(name_iid: int, values: np.ndarray, present: np.ndarray | None = None) -> Seg:
    """A TrackEvent.debug_annotations entry {name_iid, int_value} per (present) row."""
    n = len(values)
    body = concat(const(tag(pb.DebugAnnotation, "name_iid", VARINT) + varint_bytes(name_iid), n, present),
                  field_varint(pb.DebugAnnotation, "int_value", values, present))
    return field_message(pb.TrackEvent, "debug_annotations", body, present)


def annotation_strings(name_iid: int, codes: np.ndarray, strings: list[str], present: np.ndarray | None = None) -> Seg:
    """A debug annotation {name_iid, string_value} per (present) row, from a table of distinct strings."""
    table = [pb.TrackEvent(debug_annotations=[pb.DebugAnnotation(name_iid=name_iid, string_value=s)])
             .SerializeToString() for s in strings]
    return choose(codes, table or [b""], present)


def packets(timestamps: np.ndarray, event: Seg, seq: int) -> bytes:
    """Trace.packet entries: {timestamp, trusted_packet_sequence_id, sequence_flags, track_event} per row."""
    n = len(timestamps)
    fixed = (tag(pb.TracePacket, "trusted_packet_sequence_id", VARINT) + varint_bytes(seq)
             + tag(pb.TracePacket, "sequence_flags", VARINT)
             + varint_bytes(pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE))
    packet = concat(field_varint(pb.TracePacket, "timestamp", timestamps), const(fixed, n),
                    field_message(pb.TracePacket, "track_event", event))
    return bytes_of(field_message(pb.Trace, "packet", packet)).tobytes()
