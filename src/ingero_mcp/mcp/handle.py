"""The store a server serves: one read-only connection that the tool calls share, a cursor each, reopened when the
store changes on disk (a live recording)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from ingero_mcp.analysis import finished_copy, open_finished, wants_copy
from ingero_mcp.store import StoreError, segment_dir
from ingero_mcp.store.reader import cursor as store_cursor

REOPEN_MIN_S = 1.0
# A live recording whose segments grew is re-read at most once per REFRESH_FACTOR times what the last re-read cost
# (its snapshot, and the slowest call on it: the one that made the accounting's rows). On a 10M-event live store a
# re-read cost ~13 s (a 5.6 s snapshot, 7.2 s of rows), which every call paid while the recording grew; now the
# calls between re-reads answer in ~0.1 s from a snapshot at most ~50 s old. A small store (~0.1 s) is still re-read
# every second, and a store file that appears, changes or vanishes (the fold, a replacement) is re-read at once.
REFRESH_FACTOR = 4.0
# A live re-read that cost more than this (snapshot and rows; the wait above is a multiple of it) is made on a thread
# of its own, the whole trace's report asked of it too, while the calls answer from the snapshot before it, which is
# swapped out once the new one is ready: at 10M events no call after the first waited more than 0.5 s through a
# swap (one call waited 19 s before). A cheaper one is made in the call (fresh answers).
SYNC_REREAD_S = 0.5


class StoreHandle:
    """The read-only connection the tools share, reopened when the store changes on disk (a live trace)."""

    def __init__(self, path: str | Path, reopen_min_s: float = REOPEN_MIN_S,
                 refresh_factor: float = REFRESH_FACTOR, background: bool = False,
                 sync_reread_s: float = SYNC_REREAD_S) -> None:
        """`background`: open the store and make its accounting rows on a thread of their own (a live recording's
        snapshot and rows took ~13 s at 10M events, which the client's `initialize` waited for); the first call
        waits for what is left of them."""
        self.path = Path(path)
        self.reopen_min_s = reopen_min_s
        self.refresh_factor = refresh_factor
        self.open_s = 0.0  # what the last (re)open took
        self.slowest_call_s = 0.0  # the slowest tool call on the connection since
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._stamp: tuple[Any, ...] | None = None
        self._opened_at = 0.0
        self._active = 0  # tool calls using the connection now
        self.sync_reread_s = sync_reread_s
        self._retired: dict[int, list[Any]] = {}  # id -> [a connection swapped out, the calls still using it]
        self._rereading: threading.Thread | None = None  # a live re-read being made on a thread
        self._closed = False
        self.on_close: list[Callable[[], None]] = []  # what else holds the store (run_sql's process)
        self.unreadable: str | None = None  # why the store could not be opened at start (None: it could)
        self._notes: dict[int, str] = {}  # id(connection) -> what every answer from it must say (a checkpoint's reach)
        self._local = threading.local()  # the note of the connection this thread's call used
        self.served_checkpoint: int | None = None  # the last segment number of the checkpoint served at start
        self._lock.acquire()  # held until the store is open (and, opened in the background, its rows made)
        if background:
            # not a daemon, nor the re-reads': a thread inside DuckDB when the interpreter exits aborts the process
            # ('terminate called ...', exit 134); the exit waits for it instead
            threading.Thread(target=self._open_and_warm, name="ingero-store-open").start()
            return
        try:
            con = self._current(make=False)  # opened now (no cursor: the first call lays its own)
            if wants_copy(con, self.path) is not None:  # large, without its derived rows: finished on a thread
                threading.Thread(target=self._finish, name="ingero-store-finish").start()
                return  # the lock is released there
        except StoreError as exc:  # served anyway: every tool says why, and a store that appears later is read
            self.unreadable = str(exc)
        except duckdb.Error:  # a call meets it again, and says what went wrong
            pass
        self._lock.release()

    def _finish(self) -> None:
        """A large store without its derived rows: its finished copy (analysis/finished.py; made once, for every
        later process too) opened in its place, the lock held meanwhile so that the first call waits for it rather
        than derive the rows in memory beside it."""
        try:
            copy = finished_copy(self._con, self.path) if self._con is not None else None
            if copy is not None:
                con = _open(copy)
                old, self._con = self._con, con
                if old is not None:
                    old.close()
        except (StoreError, duckdb.Error):  # the store itself is served, its rows derived for the process
            pass
        finally:
            self._lock.release()

    def _open_and_warm(self) -> None:
        """The store opened and the accounting's rows made (derive.materialize, cached for every cursor), the lock
        held meanwhile; what fails is left for the first call to meet again and report. A recording with a checkpoint
        (store/checkpoint.py) is served from it at once, its answers saying how far it reaches, while the whole
        recording is read on a thread and swapped in."""
        try:
            if self._serve_checkpoint():
                return
            _make_rows(self._current())
        except StoreError as exc:
            self.unreadable = str(exc)
        except duckdb.Error:  # a call meets it again, and says what went wrong
            pass
        finally:
            self._lock.release()

    def _serve_checkpoint(self) -> bool:
        """The recording's newest checkpoint as the connection, and the whole recording's re-read started; the lock is
        held. False where there is none."""
        from ingero_mcp.store.checkpoint import open_checkpoint

        stamp = self._fingerprint()
        try:
            found = open_checkpoint(self.path)
        except OSError:
            found = None
        if found is None:
            return False
        con, seq, note = found
        try:
            _make_rows(con)  # a finished store's rows: read from its tables
        except duckdb.Error:
            con.close()
            return False
        started = time.monotonic()
        self._con, self._stamp, self._opened_at = con, stamp, started
        self.open_s, self.slowest_call_s = 0.0, 0.0
        self._notes[id(con)] = note
        self.served_checkpoint = seq
        self._rereading = threading.Thread(target=self._reread, args=(stamp,), name="ingero-store-reread")
        self._rereading.start()
        return True

    def take_note(self) -> str | None:
        """What the connection this thread's last call used says of itself (a checkpoint's reach), once."""
        note = getattr(self._local, "note", None)
        self._local.note = None
        return note

    def _fingerprint(self) -> tuple[Any, ...]:
        parts: list[Any] = []
        try:
            st = self.path.stat()
            parts.append((st.st_mtime_ns, st.st_size))
        except OSError:
            parts.append(None)
        segments = segment_dir(self.path)
        if segments.is_dir():
            files = sorted(segments.glob("*/*.parquet"))
            stamps = []
            for f in files:
                try:
                    stamps.append(f.stat().st_mtime_ns)
                except OSError:  # folded or replaced since the listing: the next call sees it
                    continue
            parts.append((len(files), max(stamps, default=0), str(files[-1]) if files else ""))
        return tuple(parts)

    @contextmanager
    def connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor of the shared connection, for one tool call; a changed store is reopened first.

        The lock is held only to pick the connection, not while the call runs, so a slow run_sql does
        not hold up the other tools (each call has its own cursor: DuckDB runs them in parallel). A
        changed store is reopened when no call is using the old connection."""
        with self._lock:
            # a connection of its own, laid out as the store's: every tool reads what the report reads
            parent = self._current()
            cursor = store_cursor(parent)
            self._active += 1
            self._local.note = self._notes.get(id(parent))
        started = time.monotonic()
        try:
            yield cursor
        finally:
            try:
                cursor.close()
            except duckdb.Error:
                pass
            with self._lock:
                if parent is self._con:
                    self._active -= 1
                    self.slowest_call_s = max(self.slowest_call_s, time.monotonic() - started)
                elif (retired := self._retired.get(id(parent))) is not None:  # swapped out by a live re-read
                    retired[1] -= 1  # while this call ran: closed by its last call (or already, by close())
                    if not retired[1]:
                        del self._retired[id(parent)]
                        parent.close()

    def _current(self, make: bool = True) -> duckdb.DuckDBPyConnection:
        """The shared connection, (re)opened first when there is none or the store changed; the lock is held. make:
        a large store without its derived rows is finished as a copy first (analysis/finished.py)."""
        if self._rereading is not None and self._con is not None:
            return self._con  # the next snapshot is being made: never a second one in the call
        stamp = self._fingerprint()
        wait = self.reopen_min_s
        cost = self.open_s + self.slowest_call_s  # what the last re-read cost
        grown = self._stamp is not None and stamp[0] == self._stamp[0]  # the file as it was: only the segments grew
        if grown:
            wait = max(wait, self.refresh_factor * cost)
        changed = stamp != self._stamp and time.monotonic() - self._opened_at >= wait
        if changed and grown and self._con is not None and cost >= self.sync_reread_s:
            if self._rereading is None and not self._closed:  # calls answer from this snapshot until the next
                self._rereading = threading.Thread(target=self._reread, args=(stamp,), name="ingero-store-reread")
                self._rereading.start()
            return self._con
        if self._con is None or (changed and self._active == 0):
            # Close first: DuckDB keeps one instance per file while any connection to it is
            # open, so opening before closing would hand back the old, unchanged instance.
            if self._con is not None:
                self._con.close()
                self._con = None
            started = time.monotonic()
            self._con = _open(self.path, make)
            self._stamp, self._opened_at = stamp, time.monotonic()
            self.open_s, self.slowest_call_s = self._opened_at - started, 0.0
        return self._con

    def _reread(self, stamp: tuple[Any, ...]) -> None:
        """A live recording's new snapshot and its accounting's rows made here, then swapped in for the calls that
        follow; the connection before it is closed by the last call still using it. A snapshot that fails (a fold
        under way) is tried again after the wait."""
        started = time.monotonic()
        try:
            con = _open(self.path)
        except (StoreError, duckdb.Error):
            con = None
        try:
            if con is not None and not self._closed:  # closed meanwhile: the rows are not wanted
                _make_rows(con, warm=True)
        except duckdb.Error:
            con.close()
            con = None
        if con is None:
            with self._lock:
                self._rereading, self._opened_at = None, time.monotonic()
            return
        with self._lock:
            self._rereading = None
            if self._closed:
                con.close()
                return
            old, active = self._con, self._active
            self._con, self._active = con, 0
            if old is not None:
                self._notes.pop(id(old), None)
            self._stamp, self._opened_at = stamp, time.monotonic()
            self.open_s, self.slowest_call_s = self._opened_at - started, 0.0
            if old is not None and active:
                self._retired[id(old)] = [old, active]
            elif old is not None:
                old.close()

    def close(self) -> None:
        """Close the connection and stop what else holds the store (tests; the process exit does it otherwise)."""
        for stop in self.on_close:
            stop()
        with self._lock:  # (held by the start-up's open in the background until it is done)
            self._closed = True
            rereading = self._rereading
        if rereading is not None:  # its end takes the lock
            rereading.join()
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
            for con, _calls in self._retired.values():
                con.close()
            self._retired.clear()


def _make_rows(con: duckdb.DuckDBPyConnection, warm: bool = False) -> None:
    """The accounting's rows made for `con` (derive.materialize, cached for every cursor of it); `warm`: the whole
    trace's report asked too, its answers kept for the store's content (analysis/answers.py), so that the first
    get_causal_chains on a new live snapshot does not pay them (~2.5 s at 10M events). Only for a snapshot no call
    uses yet: on the one in use this raced the calls for its connection. A report that fails here is left for a call
    to meet and report."""
    from ingero_mcp.analysis import diagnose, materialize

    cursor = store_cursor(con)
    try:
        materialize(cursor)
        if warm:
            try:
                diagnose(cursor)
            except Exception:  # noqa: BLE001 - only a head start
                pass
    finally:
        cursor.close()


def _open(path: Path, make: bool = True) -> duckdb.DuckDBPyConnection:
    """open_finished (open_store, or the store's finished copy), with every way a file can fail to open (unreadable,
    damaged past the checks) as a StoreError."""
    try:
        return open_finished(path, make=make)
    except StoreError:
        raise
    except (duckdb.Error, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"cannot read the trace store {path}: {first}") from exc
