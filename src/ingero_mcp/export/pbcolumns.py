"""Column-at-a-time protobuf encoding of many messages of one shape (numpy, no Python loop per row).

Perfetto's Python package builds one message object per packet: about 10 us each, 200+ s for a
10M-event trace. The timeline's bulk (call and state slices, their ends, wake-up instants, samples)
is a few packet shapes repeated millions of times, so it is encoded here a column at a time: a
message is a tree of `Field`s, each a column over the rows (absent rows: nothing, as protobuf
allows); the rows' sizes are summed bottom-up, then every field's bytes are written straight to
their offsets in one buffer (no padded matrix, no mask). Every field number comes from Perfetto's
own descriptors (`perfetto_trace_pb2`), never typed in, and the tests decode every packet back
with those same generated classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from google.protobuf.descriptor import FieldDescriptor as _F

VARINT, FIXED64, LEN = 0, 1, 2
_VARINT_TYPES = {_F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_UINT32, _F.TYPE_UINT64, _F.TYPE_ENUM, _F.TYPE_BOOL}
_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)  # a varint of k+1 bytes holds < 2^(7(k+1))


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


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes each value (uint64) takes as a varint (1..10; a negative int64 takes 10)."""
    sizes = np.ones(len(values), dtype=np.int64)
    top = values.max() if len(values) else 0
    for limit in _LIMITS:
        if top < limit:
            break
        sizes += values >= limit
    return sizes


@dataclass
class Field:
    """One field of a message, as a column over the rows: `kind` 'varint' (values), 'fixed64' (values), 'const'
    (the same bytes, key included, in every present row) or 'message' (a length-delimited body of `children`)."""

    kind: str
    key: bytes
    values: np.ndarray | None = None
    present: np.ndarray | None = None  # bool per row; None: every row
    children: list[Field] = field(default_factory=list)


def varint(message: type, name: str, values: np.ndarray, present: np.ndarray | None = None) -> Field:
    """A varint field per row (int64 values; a negative one as 10 bytes, as protobuf writes int64)."""
    return Field("varint", tag(message, name, VARINT), np.asarray(values).astype(np.int64, copy=False).view(np.uint64),
                 present)


def fixed64(message: type, name: str, values: np.ndarray, present: np.ndarray | None = None) -> Field:
    """A fixed64 field per row (little-endian)."""
    return Field("fixed64", tag(message, name, FIXED64), np.asarray(values).astype(np.int64).view(np.uint64), present)


def const(blob: bytes, present: np.ndarray | None = None) -> Field:
    """The same bytes (whole fields, keys included) in every present row."""
    return Field("const", b"", np.frombuffer(blob, dtype=np.uint8), present)


def message(message_type: type, name: str, children: list[Field], present: np.ndarray | None = None) -> Field:
    """A length-delimited field holding, per row, its children one after another (absent rows: none of them)."""
    if present is not None:
        for child in children:
            _only(child, present)
    return Field("message", tag(message_type, name, LEN), None, present, children)


def _only(f: Field, present: np.ndarray) -> None:
    """Restrict a field (and what it holds) to the rows where its parent is present."""
    f.present = present if f.present is None else f.present & present
    for child in f.children:
        _only(child, present)


def _sizes(f: Field, n: int, bodies: dict[int, np.ndarray]) -> np.ndarray:
    """Each row's bytes for `f` (0 where absent); message bodies and varint sizes kept in `bodies` for the write."""
    if f.kind == "varint":
        bodies[id(f)] = varint_sizes(f.values)
        size = len(f.key) + bodies[id(f)]
    elif f.kind == "fixed64":
        size = np.full(n, len(f.key) + 8, dtype=np.int64)
    elif f.kind == "const":
        size = np.full(n, len(f.values), dtype=np.int64)
    else:
        body = np.zeros(n, dtype=np.int64)
        for child in f.children:
            body += _sizes(child, n, bodies)
        bodies[id(f)] = body
        size = len(f.key) + varint_sizes(body.view(np.uint64)) + body
    return size if f.present is None else np.where(f.present, size, 0)


def _put_bytes(buf: np.ndarray, at: np.ndarray, blob: np.ndarray) -> None:
    """The same bytes at each offset."""
    if len(blob) <= 4:
        for j, byte in enumerate(blob):
            buf[at + j] = byte
    elif len(at):
        buf[(at[:, None] + np.arange(len(blob))).ravel()] = np.tile(blob, len(at))


def _put_varints(buf: np.ndarray, at: np.ndarray, values: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
    """Varints at the offsets; returns their sizes."""
    if sizes is None:
        sizes = varint_sizes(values)
    width = int(sizes.max()) if len(sizes) else 0
    if width <= 1:
        buf[at] = values.astype(np.uint8)
        return sizes
    result = sizes
    at, values, sizes = at.copy(), values.copy(), sizes.copy()
    for _ in range(width):
        buf[at] = (values & np.uint64(0x7F)).astype(np.uint8) | ((sizes > 1).astype(np.uint8) << 7)
        more = sizes > 1
        if not more.all():
            at, values, sizes = at[more], values[more], sizes[more]
        at += 1
        values >>= np.uint64(7)
        sizes -= 1
    return result


def _write(f: Field, buf: np.ndarray, at: np.ndarray, bodies: dict[int, np.ndarray]) -> None:
    """Write `f` for every row at `at` (the rows' cursors), moving the cursors past what was written."""
    rows = None if f.present is None else np.flatnonzero(f.present)
    here = at if rows is None else at[rows]
    _put_bytes(buf, here, np.frombuffer(f.key, dtype=np.uint8))
    here = here + len(f.key)
    if f.kind == "varint":
        sizes = bodies[id(f)] if rows is None else bodies[id(f)][rows]
        _put_varints(buf, here, f.values if rows is None else f.values[rows], sizes)
        here += sizes
    elif f.kind == "fixed64":
        vals = f.values if rows is None else f.values[rows]
        raw = np.ascontiguousarray(vals.astype("<u8")).view(np.uint8).reshape(len(vals), 8)
        buf[(here[:, None] + np.arange(8)).ravel()] = raw.ravel()
        here += 8
    elif f.kind == "const":
        _put_bytes(buf, here, f.values)
        here += len(f.values)
    else:
        body = bodies[id(f)] if rows is None else bodies[id(f)][rows]
        here += _put_varints(buf, here, body.view(np.uint64))
        sub = here.copy() if rows is None else np.zeros(len(at), dtype=np.int64)
        if rows is not None:
            sub[rows] = here
        for child in f.children:  # a child is present only where this message is (see `message`)
            _write(child, buf, sub, bodies)
        here += body
    if rows is None:
        at[:] = here
    else:
        at[rows] = here


def encode(fields: list[Field], n: int) -> bytes:
    """The rows one after another, each its fields in order (a message's fields, or Trace.packet entries)."""
    return encode_shapes([(np.arange(n), fields)], n)


def encode_shapes(shapes: list[tuple[np.ndarray, list[Field]]], n: int) -> bytes:
    """Rows of several shapes interleaved: each shape's rows go to the output positions given with it (together a
    permutation of 0..n-1), each row its shape's fields in order. Rows of one shape share its fields' columns."""
    if not n:
        return b""
    sizes = np.zeros(n, dtype=np.int64)
    measured = []
    for positions, fields in shapes:
        bodies: dict[int, np.ndarray] = {}
        shape_sizes = np.zeros(len(positions), dtype=np.int64)
        for f in fields:
            shape_sizes += _sizes(f, len(positions), bodies)
        sizes[positions] = shape_sizes
        measured.append(bodies)
    at = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=at[1:])
    buf = np.zeros(int(sizes.sum()), dtype=np.uint8)
    for (positions, fields), bodies in zip(shapes, measured):
        cursor = at[positions]
        for f in fields:
            _write(f, buf, cursor, bodies)
    return buf.tobytes()
