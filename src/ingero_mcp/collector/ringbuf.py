"""Reads a BPF ring buffer in bulk through mmap: all committed records at once, as a numpy array.

Every record in one of our rings has the same size, so the span between the consumer and producer
positions is a packed array of (8-byte header + struct) that numpy can view directly; the data area
is mapped twice back to back by the kernel, so a span that wraps is still contiguous. No Python
code runs per event. Records still being written (BUSY bit) end the batch; discarded ones (never
produced by our programs) are dropped.

The two positions are read and written as single aligned 8-byte loads/stores (ctypes c_uint64):
a byte-wise write of consumer_pos (what struct.pack_into does) can show the kernel a torn, smaller
value for an instant, and the kernel then sees the ring as full and drops records.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

PAGE = mmap.PAGESIZE
BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30


class RingReader:
    """Consumer side of one BPF_MAP_TYPE_RINGBUF whose records are all `dtype` (header included)."""

    def __init__(self, map_fd: int, size_bytes: int, dtype: np.dtype) -> None:
        if dtype.itemsize % 8:
            raise ValueError("ring records must be 8-byte multiples (header included)")
        self.size = size_bytes
        self.mask = size_bytes - 1
        self.dtype = dtype
        self.record = dtype.itemsize
        self._cons = mmap.mmap(map_fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod = mmap.mmap(map_fd, PAGE + 2 * size_bytes, mmap.MAP_SHARED, mmap.PROT_READ, offset=PAGE)
        self._prod_bytes = np.frombuffer(self._prod, np.uint8)
        self._cons_pos = ctypes.c_uint64.from_buffer(self._cons)
        self._prod_pos = ctypes.c_uint64.from_address(self._prod_bytes.ctypes.data)
        self.records_read = 0

    def read(self) -> np.ndarray:
        """Consume every committed record now in the ring; returns a copy (header fields included)."""
        cons = self._cons_pos.value
        prod = self._prod_pos.value
        avail = prod - cons
        if avail <= 0:
            return np.empty(0, self.dtype)
        if avail % self.record:
            raise RuntimeError(f"ring record size mismatch: {avail} bytes pending, record {self.record}")
        n = min(avail // self.record, self.size // self.record)
        view = np.frombuffer(self._prod, dtype=self.dtype, count=n, offset=PAGE + (cons & self.mask))
        busy = (view["_len"] & BUSY_BIT) != 0
        if busy.any():
            n = int(np.argmax(busy))
        out = view[:n].copy()
        del view, busy
        if n:
            self._cons_pos.value = cons + n * self.record
            discarded = (out["_len"] & DISCARD_BIT) != 0
            if discarded.any():
                out = out[~discarded]
        self.records_read += len(out)
        return out

    def close(self) -> None:
        """Unmap the ring."""
        del self._cons_pos, self._prod_pos, self._prod_bytes
        self._prod.close()
        self._cons.close()
