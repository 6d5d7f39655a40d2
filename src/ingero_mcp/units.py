"""Units and their formats, in one place for every room: durations, sizes, counts, shares and moments.

Two styles. The terminal's (`ns`, `ns3`, `secs`, `nbytes`, ...) reads best at a glance. The MCP results' (`fmt_ns`,
`fmt_rel`, ...) is exact: three decimals in every unit, and offsets from the trace start that a tool reads back
(get_timeline's `around`).
"""

from __future__ import annotations

from datetime import UTC, datetime


def ns(value: float | int | None) -> str:
    """A duration in the unit that reads best: 850 ns, 12.3 us, 4.56 ms, 1.23 s."""
    if value is None:
        return "-"
    v = float(value)
    if abs(v) < 1_000:
        return f"{v:,.0f} ns"
    if abs(v) < 1_000_000:
        return f"{v / 1e3:,.1f} us"
    if abs(v) < 1_000_000_000:
        return f"{v / 1e6:,.2f} ms"
    return f"{v / 1e9:,.2f} s"


def ns3(value: float | int | None) -> str:
    """A duration in three significant digits, for narrow columns: 850 ns, 12.3 us, 4.56 ms, 308 ms, 1.23 s."""
    if value is None:
        return "-"
    v = float(value)
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if abs(v) >= scale:
            x = v / scale
            return f"{x:,.0f} {unit}" if abs(x) >= 100 else f"{x:.1f} {unit}" if abs(x) >= 10 else f"{x:.2f} {unit}"
    return f"{v:,.0f} ns"


def secs(value: float | int | None) -> str:
    """ns as seconds in a column whose header gives the unit (e.g. thread-seconds): 637.4, 8.81, 0.052, <0.001."""
    if value is None:
        return "-"
    s = float(value) / 1e9
    if s == 0:
        return "0"
    if abs(s) < 0.0005:
        return "<0.001"
    return f"{s:,.1f}" if abs(s) >= 100 else f"{s:,.2f}" if abs(s) >= 1 else f"{s:,.3f}"


def nbytes(value: float | int | None) -> str:
    """Bytes in binary units."""
    if value is None:
        return "-"
    v = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1024
    return f"{v:,.1f} TiB"


def count(value: int | None) -> str:
    """An integer with thousands separators."""
    return "-" if value is None else f"{int(value):,}"


def pct(value: float | None) -> str:
    """A fraction (0..1+) as a percentage."""
    return "-" if value is None else f"{100 * value:,.1f}%"


def utc(ts_ns: int | None) -> str:
    """ns since the epoch as a UTC time with milliseconds."""
    if ts_ns is None:
        return "-"
    return datetime.fromtimestamp(ts_ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def rel(ts_ns: int, start_ns: int) -> str:
    """A moment as seconds from the trace start, e.g. +12.345 s."""
    ms = (ts_ns - start_ns) // 1_000_000  # truncated like utc(), so the two columns agree
    return f"+{ms // 1000:,}.{ms % 1000:03d} s"


def pid_ranges(pids: list[int], limit: int = 4) -> str:
    """Consecutive pids folded into ranges: [2254..2260, 2262] -> '2254-2260, 2262'."""
    runs: list[list[int]] = []
    for p in sorted(pids):
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    parts = [f"{a}-{b}" if b > a else str(a) for a, b in runs]
    return ", ".join(parts[:limit]) + (f" +{len(parts) - limit} more" if len(parts) > limit else "")


# The MCP results' formats.


def fmt_ns(ns: float | int | None) -> str:
    """A duration in the largest unit that keeps it >= 1, three decimals (every MCP result's durations)."""
    if ns is None:
        return "-"
    value = float(ns)
    for unit, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3f} {unit}"
    return f"{int(value)} ns"


def fmt_rel(ts_ns: int | None, origin_ns: int) -> str:
    """A moment as seconds after the trace start (what get_timeline's `around` reads back)."""
    if ts_ns is None:
        return "-"
    return f"{(ts_ns - origin_ns) / 1e9:+.6f} s"


def fmt_bytes(n: int | None) -> str:
    """Bytes in binary units."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def fmt_wall(ts_ns: int) -> str:
    """A moment as UTC wall-clock time."""
    return datetime.fromtimestamp(ts_ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def fmt_pct(value: float | None) -> str:
    """A value already in percent (0..100) with one decimal."""
    return "-" if value is None else f"{value:.1f}%"
