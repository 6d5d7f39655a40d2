"""host_pinned of copies: the pinned host ranges each traced process registered, followed call by call.

A copy's host address (H2D: src, D2H: dst) is pinned when it falls in a range the process got from
cudaHostAlloc / cuMemHostAlloc / cudaMallocHost / cuMemAllocHost_v2 or registered with
cudaHostRegister / cuMemHostRegister_v2, and not yet freed or unregistered (schemas/v2.sql):
TRUE inside such a range; FALSE outside every range only when the process is known to have been
traced from before its first pinned allocation (`complete(pid)`), since a range made earlier is
invisible; NULL otherwise. Pure and columnar: records in, one Arrow column out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from ingero_mcp.collector.ops import OP_NAMES, PIN_EFFECT

_EFFECT = np.array([PIN_EFFECT.get(name, 0) for name in OP_NAMES], np.int8)
_H2D, _D2H = 2, 3  # memcpy kind codes (cudaMemcpyKind + 1)


class PinnedRanges:
    """Per pid: {base: size} of the pinned host ranges alive now."""

    def __init__(self) -> None:
        self.ranges: dict[int, dict[int, int]] = {}

    def forget(self, pid: int) -> None:
        """The process exited (or exec'd): its ranges are gone."""
        self.ranges.pop(pid, None)

    def _inside(self, pid: int, ptrs: np.ndarray) -> np.ndarray:
        live = self.ranges.get(pid)
        if not live:
            return np.zeros(len(ptrs), bool)
        bases = np.array(sorted(live), np.uint64)
        ends = bases + np.array([live[int(b)] for b in bases.tolist()], np.uint64)
        idx = np.searchsorted(bases, ptrs, side="right") - 1
        ok = idx >= 0
        inside = np.zeros(len(ptrs), bool)
        inside[ok] = ptrs[ok] < ends[idx[ok]]
        return inside

    def annotate(self, pid: np.ndarray, op: np.ndarray, ret: np.ndarray, ts: np.ndarray, kind: np.ndarray,
                 host_ptr: np.ndarray, has_ptr: np.ndarray, nbytes: np.ndarray,
                 complete: Callable[[int], bool]) -> pa.Array:
        """host_pinned for one batch of calls (in any order; applied in time order), updating the ranges."""
        n = len(pid)
        out = np.zeros(n, bool)
        known = np.zeros(n, bool)
        effect = _EFFECT[op.astype(np.int64)]
        pins = (effect != 0) & has_ptr & (ret == 0)
        copies = has_ptr & ((kind == _H2D) | (kind == _D2H))
        if not (pins.any() or copies.any()):
            return pa.nulls(n, pa.bool_())
        for p in np.unique(pid[pins | copies]).tolist():
            mine = np.nonzero((pid == p) & (pins | copies))[0]
            mine = mine[np.argsort(ts[mine], kind="stable")]
            is_pin = pins[mine]
            # copies between two range changes are looked up together
            cuts = np.nonzero(is_pin)[0].tolist() + [len(mine)]
            start = 0
            full = complete(int(p))
            for cut in cuts:
                seg = mine[start:cut]
                if len(seg):
                    inside = self._inside(int(p), host_ptr[seg])
                    out[seg] = inside
                    known[seg] = inside | full
                if cut < len(mine):
                    row = mine[cut]
                    live = self.ranges.setdefault(int(p), {})
                    base = int(host_ptr[row])
                    if effect[row] > 0:
                        live[base] = int(nbytes[row])
                    else:
                        live.pop(base, None)
                start = cut + 1
        known &= copies
        return pa.array(out, pa.bool_(), mask=~known)
