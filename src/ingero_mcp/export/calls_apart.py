"""The Perfetto export's CUDA calls encoded by a second process while this one writes everything else.

The column encoder holds the interpreter, and the calls are ~60% of a large export's encoding: on two or more CPUs a
spawned child opens the store itself (read-only, as DuckDB lets several processes do), encodes the calls onto their
threads' own sequences into a part file beside the output, and the part is appended to the output at the end. A
sequence's packets all come from one process in their order, and every sequence declares its own interned names and
its clock, so the two halves need no shared state beyond the track layout (`seq_of`, planned before either starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

import duckdb

from ingero_mcp.export import events as ev
from ingero_mcp.export import perfetto as pf
from ingero_mcp.store.errors import StoreError
from ingero_mcp.store.segments import has_segments

# Calls in scope from which a child pays for its start-up (~0.5 s): at 0.75M calls one made the export 1.2 -> 1.4 s,
# at 3M 3.0 -> 2.8 s, at 7.45M 7.6 -> 6.1 s (bench/README.md).
APART_FROM = 3_000_000


class ExportChildError(StoreError):
    """The process encoding the calls failed or died; its reason is the message."""


class CallsApart:
    """A child encoding the calls (`python -m ingero_mcp.export.calls_apart`): started first, it imports and opens the
    store while this process finds the chains and lays out the tracks, then reads its task as JSON on its stdin
    (`send`). It prints its progress, a count of calls a line, and last the counts it wrote; a thread here reads them.
    """

    def __init__(self, db: str | os.PathLike[str], folder: Path | None, total: int) -> None:
        fd, path = tempfile.mkstemp(prefix=".ingero-calls-", suffix=".part", dir=folder)
        os.close(fd)
        self.part, self.total = Path(path), total
        self.done, self.counts, self.errors = 0, None, b""
        env = dict(os.environ)  # this package first where the child looks (a checkout run from src/, a test's path)
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ingero_mcp.export.calls_apart", os.path.abspath(db), path], env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError:
            self.part.unlink(missing_ok=True)
            raise
        self.reader = threading.Thread(target=self._read, name="export-calls-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None and self.process.stderr is not None
        for line in self.process.stdout:
            if line.startswith(b"{"):
                self.counts = json.loads(line)
            elif line.strip().isdigit():
                self.done = int(line)
        self.errors = self.process.stderr.read()

    def send(self, scope: ev.Scope, thread_seq: dict[int, int], seq_of: dict[int, int], origin: int) -> None:
        """The task: the scope, the track layout and the clock's origin (a child that died is found at `finish`)."""
        window = None if scope.window is None else [scope.window.start_ns, scope.window.end_ns]
        task = {"window": window, "pids": scope.pids, "origin": origin, "thread_seq": list(thread_seq.items()),
                "seq_of": list(seq_of.items())}
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(task).encode())
            self.process.stdin.close()
        except OSError:
            pass

    def finish(self, out: IO[bytes], counts: dict[str, int], tell: pf.Progress) -> None:
        """Wait for the child (its progress told as the calls' stage), add its counts, append its part to `out`."""
        while self.reader.is_alive():
            tell("calls", self.done, self.total)
            self.reader.join(0.1)
        code = self.process.wait()
        if code != 0 or self.counts is None:
            reason = self.errors.decode(errors="replace").strip().splitlines()
            raise ExportChildError(f"the process encoding the CUDA calls failed (exit code {code})"
                                   + (f": {reason[-1]}" if reason else ""))
        tell("calls", self.total, self.total)
        for key, value in self.counts.items():
            counts[key] += value
        out.flush()
        with open(self.part, "rb") as part:
            _append(part, out)

    def close(self) -> None:
        """Stop the child if it still runs and remove its part file."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.reader.join()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        self.part.unlink(missing_ok=True)


def start(con: duckdb.DuckDBPyConnection, db: str | os.PathLike[str], out: str | os.PathLike[str],
          scope: ev.Scope) -> CallsApart | None:
    """A child to encode the calls of `db` in `scope`, or None where this process should: a live recording (its
    snapshot is this process's own), few calls, one CPU, or no process could be started. Its part file goes beside
    `out` (where the output's temporary file is: the append stays on one file system)."""
    if has_segments(db) or len(os.sched_getaffinity(0)) < 2:
        return None
    calls = int(ev.rows(con, f"SELECT count(*) FROM cuda_calls {scope.calls()}")[0][0])
    if calls < APART_FROM:
        return None
    target = Path(os.path.realpath(out))
    folder = target.parent if target.parent.is_dir() and not target.is_char_device() and not target.is_fifo() \
        else None
    try:
        return CallsApart(db, folder, calls)
    except OSError:
        return None


def _encode(db: str, part: str) -> None:
    """The child: open the store, then read the task, encode the calls onto their sequences into the part file and
    print the counts."""
    from ingero_mcp.analysis import TimeWindow
    from ingero_mcp.export.run import EXPORT_DUCKDB
    from ingero_mcp.store import open_store

    con = open_store(db, settings=EXPORT_DUCKDB)
    task = json.load(sys.stdin)
    window = task["window"]
    scope = ev.Scope(window=None if window is None else TimeWindow(start_ns=window[0], end_ns=window[1]),
                     pids=task["pids"])
    counts = {"call_slices": 0, "call_instants": 0}
    with open(part, "wb") as f:
        w = pf._Writer(f, task["origin"], dict(task["seq_of"]), misc=False)

        def tell(stage: str, n: int, total: int | None) -> None:
            print(n, flush=True)

        pf._calls(con, w, scope, dict(task["thread_seq"]), counts, tell)
    con.close()
    print(json.dumps(counts), flush=True)


def _append(part: IO[bytes], out: IO[bytes]) -> None:
    """Copy `part` to the end of `out` in the kernel (sendfile), or through a buffer where it cannot."""
    size = os.fstat(part.fileno()).st_size
    sent = 0
    try:
        while sent < size:
            n = os.sendfile(out.fileno(), part.fileno(), sent, size - sent)
            if n == 0:
                break
            sent += n
    except OSError:
        if sent:
            raise
    if sent < size:
        part.seek(sent)
        while chunk := part.read(1 << 22):
            out.write(chunk)
        out.flush()


if __name__ == "__main__":
    _encode(sys.argv[1], sys.argv[2])
