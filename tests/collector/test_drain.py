"""The ring reader's sleep between reads (collector/tracer.py drain_wait) and the --poll-interval bounds: few
wake-ups when little arrives, a read before any ring passes a quarter full when a lot does."""

from __future__ import annotations

import argparse

import pytest

from ingero_mcp.cli.trace import _poll_interval
from ingero_mcp.collector import records as R
from ingero_mcp.collector.tracer import (
    CUDA_RB_PAGES,
    DRAIN_FILL,
    MIN_POLL_S,
    FillSinceRead,
    drain_wait,
)


def test_an_idle_ring_waits_the_longest_allowed() -> None:
    assert drain_wait(0.0, 0.25, 0.25) == 0.25
    assert drain_wait(0.0, 0.01, 1.0) == 1.0


def test_a_filling_ring_is_read_before_it_passes_a_quarter_full() -> None:
    records = CUDA_RB_PAGES * 4096 / R.CUDA_DTYPE.itemsize  # call records the CUDA ring holds
    per_read = 20_000  # 1M calls/s, read after 20 ms
    wait = drain_wait(per_read / records, 0.02, 0.25)
    assert wait < 0.25
    assert wait * 1_000_000 == pytest.approx(DRAIN_FILL * records, rel=1e-6)  # a quarter of the ring by the next read


def test_a_ring_filling_faster_than_the_floor_allows_is_read_every_min_poll() -> None:
    assert drain_wait(0.5, 0.01, 0.25) == MIN_POLL_S  # half the ring in 10 ms


def test_reads_by_the_governor_count_towards_the_readers_pace() -> None:
    """The governor drains the rings before each decision; what it took arrived all the same, so the reader's
    next sleep is the one the whole arrival rate calls for, not the longer one its own small read suggests."""
    filled = FillSinceRead()
    filled.add("cuda", 0.08)  # the governor's read, 15 ms after the reader's last
    filled.add("sched", 0.01)
    filled.add("cuda", 0.02)  # the reader's own, 5 ms later
    fill = filled.take()
    assert fill == pytest.approx(0.10)
    assert drain_wait(fill, 0.02, 0.25) == pytest.approx(DRAIN_FILL / (0.10 / 0.02))
    assert drain_wait(fill, 0.02, 0.25) < drain_wait(0.02, 0.02, 0.25)  # what the reader alone would have slept
    assert filled.take() == 0.0  # each take starts over


def test_the_fullest_ring_sets_the_pace() -> None:
    filled = FillSinceRead()
    filled.add("cuda", 0.05)
    filled.add("sched", 0.3)
    filled.add("proc", 0.0)
    assert filled.take() == pytest.approx(0.3)


@pytest.mark.parametrize("text,seconds", [("0.25", 0.25), ("250ms", 0.25), ("1", 1.0), ("10ms", 0.01)])
def test_poll_interval_parses(text: str, seconds: float) -> None:
    assert _poll_interval(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "0", "5ms", "soon"])
def test_poll_interval_out_of_range_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _poll_interval(text)
