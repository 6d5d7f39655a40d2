"""A live recording's checkpoint: a finished copy of what it has recorded so far, for a reader that starts late.

A reader that opens a recording in progress merges the store file and every segment into a private snapshot and
makes the accounting's rows over it: at 10M events 15-25 s before its first answer. So the recording's writer keeps
`<db>.checkpoint/<seq>.duckdb` now and then, made by a child process at the lowest CPU priority: a finished store of
everything up to segment number <seq>, its derived rows and the whole trace's answers recorded as the fold records
them. A reader (the MCP server) answers from it at once, saying how far it reaches, while it reads the rest. Each
checkpoint starts from a copy of the one before and adds only the newer segments; it appears by a rename once
complete, so no reader sees half of one; the fold removes the folder with the segments.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ingero_mcp.store.segments import (fsync_path, has_segments, list_segments, remove_store_file, segment_dir,
                                      segment_seq)

log = logging.getLogger("ingero_mcp.store")

# The first checkpoint after this much recording, and none sooner than this after the one before ...
CHECKPOINT_MIN_S = 30.0
# ... nor sooner than this many times what the one before took (wall seconds, at nice 19): the child then uses at most
# ~1/21 of the time (a checkpoint of a 10M-event recording: ~17-21 s here, ~1.6 cores while it runs).
CHECKPOINT_FACTOR = 20.0
# After this many failures in a row (a full disk, a store it cannot read) no more are tried in this recording.
CHECKPOINT_MAX_FAILURES = 3


def checkpoint_dir(db_path: str | os.PathLike[str]) -> Path:
    """Where a live recording of `db_path` keeps its checkpoint."""
    return Path(f"{os.fspath(db_path)}.checkpoint")


def latest_checkpoint(db_path: str | os.PathLike[str]) -> tuple[Path, int] | None:
    """The newest complete checkpoint of `db_path` and the last segment number it holds; None where there is none."""
    folder = checkpoint_dir(db_path)
    found = [(int(f.stem), f) for f in folder.glob("*.duckdb") if f.stem.isdigit()] if folder.is_dir() else []
    if not found:
        return None
    seq, file = max(found)
    return file, seq


def open_checkpoint(db_path: str | os.PathLike[str]) -> tuple[Any, int, str] | None:
    """The newest checkpoint of a live recording, opened as `open_store` opens a finished store, the last segment
    number it holds, and a line that says how far it reaches; None where there is none or it cannot be read."""
    import duckdb

    from ingero_mcp.store.errors import StoreError
    from ingero_mcp.store.reader import open_store

    for _ in range(3):  # replaced by a newer one between the listing and the open: the newer one
        found = latest_checkpoint(db_path)
        if found is None:
            return None
        file, seq = found
        numbers = _segment_numbers(db_path)
        if seq > max(numbers, default=0):
            return None  # it holds segments that are gone: another recording's, or one whose segments were removed
        try:
            made = file.stat().st_mtime
            con = open_store(file)
        except (StoreError, duckdb.Error, OSError):
            continue
        newer = sum(1 for n in numbers if n > seq)
        note = (f"answered from the recording's checkpoint, made {max(0.0, time.time() - made):.0f} s ago (its "
                f"segments up to #{seq}); " + (f"{newer} newer segment(s) are being read: ask again shortly for the "
                "rest" if newer else "no segment is newer"))
        return con, seq, note
    return None


def _segment_numbers(db_path: str | os.PathLike[str]) -> list[int]:
    """The numbers of a live recording's readable segments (latest-state files have none)."""
    by_table, _ = list_segments(segment_dir(db_path))
    return [seq for files in by_table.values() for f in files if (seq := segment_seq(f)) is not None]


def newest_segment(db_path: str | os.PathLike[str]) -> int:
    """The highest segment number a live recording of `db_path` has written (0: none)."""
    return max(_segment_numbers(db_path), default=0)


def write_checkpoint(db_path: str | os.PathLike[str], derive: Callable[[Any], object]) -> Path | None:
    """Make the newest checkpoint of the recording at `db_path` (`derive`: analysis.derive.store_derived); the one
    before it is removed. Returns its path (the one before where no segment is newer), None where there is no
    recording in progress."""
    import duckdb

    from ingero_mcp.store.reader import merge_live

    path = Path(db_path)
    if not has_segments(path):
        return None
    folder = checkpoint_dir(path)
    folder.mkdir(exist_ok=True)
    previous = latest_checkpoint(path)
    if previous is not None and newest_segment(path) <= previous[1]:
        return previous[0]
    tmp = folder / f".{os.getpid()}.duckdb"
    remove_store_file(tmp)
    if previous is not None:
        shutil.copyfile(previous[0], tmp)
    build = duckdb.connect(str(tmp))
    try:
        build.execute("SET enable_progress_bar = false").fetchall()
        _, seq = merge_live(build, path, segment_dir(path), previous[1] if previous is not None else None)
        derive(build)  # the copy's derived rows and recorded answers replaced, not added to
        build.execute("CHECKPOINT").fetchall()
    except BaseException:
        build.close()
        remove_store_file(tmp)
        raise
    build.close()
    final = folder / f"{seq:09d}.duckdb"
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(folder)
    for file in folder.glob("*.duckdb"):
        if file.stem.isdigit() and file != final:
            file.unlink(missing_ok=True)  # a reader that has it open keeps reading it
    return final



class Checkpointer:
    """Starts `write_checkpoint` in a child process now and then while a recording grows (the live writer's flush
    calls `poll`), one at a time, at nice 19; `stop` ends one under way (before the fold)."""

    def __init__(self, db_path: str | os.PathLike[str], derive: Callable[[Any], object],
                 min_s: float = CHECKPOINT_MIN_S, factor: float = CHECKPOINT_FACTOR) -> None:
        self.path = Path(db_path)
        self.target = f"{derive.__module__}:{derive.__qualname__}"
        self.min_s, self.factor = min_s, factor
        self._child: subprocess.Popen[bytes] | None = None
        self._child_started = 0.0
        self._last_end = time.monotonic()  # the recording's start counts as the end of none
        self.last_cost_s = 0.0
        self.made = 0
        self.failed = 0
        self.failed_in_row = 0
        self.cpu_s = 0.0  # the CPU seconds of the children reaped: the recording's cost too

    def poll(self) -> None:
        """Collect a finished child; start the next one when it is due."""
        now = time.monotonic()
        if self._child is not None:
            pid, status, usage = os.wait4(self._child.pid, os.WNOHANG)
            if pid == 0:
                return
            self._collected(status, usage)
            self.last_cost_s, self._last_end = now - self._child_started, now
            code = os.waitstatus_to_exitcode(status)
            if code == 0:
                self.made += 1
                self.failed_in_row = 0
            else:
                self.failed += 1
                self.failed_in_row += 1
                log.warning("checkpoint of %s failed (exit %s): %s%s", self.path, code, self._error_line(),
                            "; no more will be tried" if self.failed_in_row >= CHECKPOINT_MAX_FAILURES else "")
            return
        if self.failed_in_row >= CHECKPOINT_MAX_FAILURES:
            return
        if now - self._last_end < max(self.min_s, self.factor * self.last_cost_s):
            return
        folder = checkpoint_dir(self.path)
        folder.mkdir(exist_ok=True)
        with open(folder / ".error", "wb") as errors:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "ingero_mcp.store.checkpoint", str(self.path), self.target],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors)
        self._child_started = now

    def _error_line(self) -> str:
        try:
            lines = (checkpoint_dir(self.path) / ".error").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no message"
        return lines[-1][:300] if lines else "no message"

    def _collected(self, status: int, usage: Any) -> None:
        """The child reaped here (os.wait4, for its CPU seconds), so its Popen is told it is gone."""
        assert self._child is not None
        self.cpu_s += usage.ru_utime + usage.ru_stime
        self._child.returncode = os.waitstatus_to_exitcode(status)
        self._child = None

    def stop(self) -> None:
        """End a checkpoint under way (its half-made file is removed with the folder at the fold)."""
        if self._child is None:
            return
        self._child.terminate()
        pid, status, usage = os.wait4(self._child.pid, 0)
        self._collected(status, usage)


def main(argv: list[str] | None = None) -> int:
    """The checkpoint child: `python -m ingero_mcp.store.checkpoint DB MODULE:FUNCTION`."""
    parser = argparse.ArgumentParser(description="Write a live recording's checkpoint (run by its writer).")
    parser.add_argument("db", type=Path, help="the recording's store file")
    parser.add_argument("derive", help="MODULE:FUNCTION that stores a finished store's derived rows")
    args = parser.parse_args(argv)
    os.nice(19)  # behind the traced job and the collector, always
    module, _, name = args.derive.partition(":")
    derive = getattr(importlib.import_module(module), name)
    write_checkpoint(args.db, derive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
