"""The column encoder (`pbcolumns`) writes, row for row, the packets Perfetto's own generated classes write.

Rows of a nested shape (packet > track event > debug annotations), with fields absent in some rows,
0, negative (10-byte) and 64-bit values, constants between them and fixed64 flow ids, are encoded
in one go and parsed back with `perfetto_trace_pb2`; each packet must equal the one built by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ingero_mcp.export import pbcolumns as col

TE, DA = pb.TrackEvent, pb.DebugAnnotation


def shape(c: dict[str, np.ndarray]) -> list[col.Field]:
    """Trace.packet {timestamp, sequence id, track_event {type (const), name_iid, 2 args, flow ids}}."""
    def arg() -> col.Field:  # a Field per message: a message restricts its children to its rows
        return col.const(col.tag(DA, "name_iid", col.VARINT) + col.varint_bytes(3))

    return [col.message(pb.Trace, "packet", [
        col.varint(pb.TracePacket, "timestamp", c["ts"]),
        col.varint(pb.TracePacket, "trusted_packet_sequence_id", c["seq"]),
        col.message(pb.TracePacket, "track_event", [
            col.const(TE(type=TE.TYPE_SLICE_BEGIN).SerializeToString()),
            col.varint(TE, "name_iid", c["name"], c["named"]),
            col.message(TE, "debug_annotations", [arg(), col.varint(DA, "int_value", c["value"])], c["has_value"]),
            col.message(TE, "debug_annotations", [arg(), col.varint(DA, "string_value_iid", c["name"])]),
            col.fixed64(TE, "flow_ids", c["flow"], c["has_flow"])])])]


def expected(c: dict[str, np.ndarray], i: int) -> pb.TracePacket:
    """Row i's packet built with the generated classes."""
    e = TE(type=TE.TYPE_SLICE_BEGIN)
    if c["named"][i]:
        e.name_iid = int(c["name"][i])
    if c["has_value"][i]:
        e.debug_annotations.add(name_iid=3, int_value=int(c["value"][i]))
    e.debug_annotations.add(name_iid=3, string_value_iid=int(c["name"][i]))
    if c["has_flow"][i]:
        e.flow_ids.append(int(c["flow"][i]) % (1 << 64))
    return pb.TracePacket(timestamp=int(c["ts"][i]) % (1 << 64), trusted_packet_sequence_id=int(c["seq"][i]),
                          track_event=e)


@pytest.mark.parametrize("n", [1, 7, 3000])
def test_rows_decode_to_the_packets_pb2_writes(n: int) -> None:
    rng = np.random.default_rng(n)
    wide = rng.integers(-(1 << 62), 1 << 62, n) >> rng.integers(0, 63, n)  # 1..10-byte varints, negatives too
    c = {"ts": np.abs(wide), "seq": rng.integers(1, 300, n), "name": rng.integers(0, 20_000, n),
         "named": rng.random(n) < 0.7, "value": wide, "has_value": rng.random(n) < 0.5,
         "flow": rng.integers(-(1 << 62), 1 << 62, n), "has_flow": rng.random(n) < 0.3}
    trace = pb.Trace()
    trace.ParseFromString(col.encode(shape(c), n).tobytes())
    assert len(trace.packet) == n
    for i, packet in enumerate(trace.packet):
        assert packet == expected(c, i), i


def test_no_rows_no_bytes() -> None:
    empty = np.zeros(0, dtype=np.int64)
    assert col.encode([col.varint(pb.TracePacket, "timestamp", empty)], 0).tobytes() == b""


@pytest.mark.parametrize("n", [1, 500])
def test_constants_and_full_or_empty_presence(n: int) -> None:
    """A varint of one value in every row (written as a constant), a field present in every row or in none, and a
    constant right after a message that ends in a constant: the constant stays outside that message's length."""
    one = np.ones(n, dtype=bool)
    seq = col.const(col.tag(pb.TracePacket, "trusted_packet_sequence_id", col.VARINT) + col.varint_bytes(300))
    fields = [col.message(pb.Trace, "packet", [
        col.varint(pb.TracePacket, "timestamp", np.full(n, 1 << 40)),
        col.message(pb.TracePacket, "track_event", [
            col.varint(TE, "name_iid", np.arange(n), ~one),
            col.varint(TE, "track_uuid", np.full(n, 5), one),
            col.const(TE(type=TE.TYPE_SLICE_END).SerializeToString())], one), seq])]
    trace = pb.Trace()
    trace.ParseFromString(col.encode(fields, n).tobytes())
    want = pb.TracePacket(timestamp=1 << 40, trusted_packet_sequence_id=300,
                          track_event=TE(track_uuid=5, type=TE.TYPE_SLICE_END))
    assert list(trace.packet) == [want] * n
