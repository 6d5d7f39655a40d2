"""run_sql in a child process, so that a query is stopped at its timeout and its memory limit whatever it does.

DuckDB looks for an interrupt between pieces of work, not inside one, and its memory_limit covers its buffers,
not the values a function builds: `SELECT count(*) FROM (SELECT unnest(range(200000000)))` is one piece that
ran 55 s past a 10 s interrupt and grew the server to 13.8 GB with memory_limit at 1 GB. So the queries run in
a child holding its own read-only connection (DuckDB's memory_limit, a private temporary folder with a size
cap, the interrupt at the timeout for the queries that heed it), and the server waits for the answer up to the
timeout while watching the child's memory: past either limit the child is killed, the tool answers at once
with the reason, and the next query starts a new child. A child also starts anew when the store changes on
disk (a live recording), as the server's own connection does.

Child protocol (`python -m ingero_mcp.mcp.sqlworker`): one JSON line in (sql, limit, timeout_s), one JSON line
out (the SqlResult, or an error); a first line {"ready": true} (or {"error": ...}) once the store is open.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ingero_mcp.mcp.sql import SqlError, SqlResult

GiB = 1 << 30
START_TIMEOUT_S = 120.0  # opening a store (a live one builds its snapshot) before the first query
GRACE_S = 1.0  # past the timeout, for the child's own interrupt to answer before it is killed
POLL_S = 0.05


@dataclass(frozen=True)
class Limits:
    """What one query may take: the child's resident memory (killed past it), DuckDB's own memory_limit inside
    it (bytes), and the size of the temporary files DuckDB may spill to."""

    memory_bytes: int
    duckdb_memory_bytes: int
    temp_bytes: int

    @classmethod
    def for_this_machine(cls) -> Limits:
        """A quarter of the RAM capped at 4 GiB (DuckDB gets half of it), temp files up to 4 GiB or a quarter of
        the free space of the temporary folder's disk."""
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        memory = max(256 << 20, min(ram // 4, 4 * GiB))
        free = shutil.disk_usage(tempfile.gettempdir()).free
        return cls(memory, memory // 2, max(64 << 20, min(4 * GiB, free // 4)))


def _rss_bytes(pid: int) -> int:
    """Resident memory of `pid` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class SqlWorker:
    """The child that runs run_sql's queries, one at a time; started on the first query, again after a kill."""

    def __init__(self, db_path: str | Path, limits: Limits | None = None,
                 fingerprint: Callable[[], object] | None = None, reopen_min_s: float = 1.0) -> None:
        self.db_path = Path(db_path)
        self.limits = limits or Limits.for_this_machine()
        self.fingerprint = fingerprint or (lambda: None)
        self.reopen_min_s = reopen_min_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._temp: Path | None = None
        self._stamp: object = None
        self._started = 0.0

    # ---- the child's life ---------------------------------------------------------------------

    def _start(self) -> None:
        self._temp = Path(tempfile.mkdtemp(prefix="ingero-mcp-sql-"))  # private: mode 0700
        settings = {"memory_limit": f"{self.limits.duckdb_memory_bytes // (1 << 20)}MiB",
                    "temp_directory": str(self._temp / "spill"),
                    "max_temp_directory_size": f"{self.limits.temp_bytes // (1 << 20)}MiB"}
        self._stamp, self._started = self.fingerprint(), time.monotonic()
        with open(self._temp / "stderr", "w") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ingero_mcp.mcp.sqlworker", str(self.db_path.resolve()), json.dumps(settings)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, encoding="utf-8",
                errors="replace", cwd=self._temp, start_new_session=True,  # a Ctrl-C meant for the server is its own
            )
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self._proc, self._lines), daemon=True).start()
        first = self._wait(time.monotonic() + START_TIMEOUT_S, None)
        if "error" in first:
            self.stop()
            raise SqlError(first["error"])

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def stop(self) -> None:
        """Kill the child (if any) and remove its temporary folder."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    def _why_it_ended(self) -> str:
        """The last line the child wrote on stderr, if any."""
        try:
            tail = (self._temp / "stderr").read_text(errors="replace").strip().splitlines() if self._temp else []
        except OSError:
            tail = []
        return tail[-1][:300] if tail else ""

    def _wait(self, deadline: float, timeout_message: str | None) -> dict[str, Any]:
        """The child's next line as JSON; kills it past `deadline` or past the memory limit."""
        assert self._proc is not None
        while True:
            try:
                line = self._lines.get(timeout=POLL_S)
            except queue.Empty:
                line = ""
            if line is None:
                code = self._proc.wait()
                why = self._why_it_ended()
                self.stop()
                raise SqlError(f"the query process ended (exit {code})" + (f": {why}" if why else ""))
            if line:
                return json.loads(line)
            if _rss_bytes(self._proc.pid) > self.limits.memory_bytes:
                self.stop()
                raise SqlError(f"query stopped: it needed more than {self.limits.memory_bytes / GiB:.1f} GiB of memory "
                               "(run_sql's limit on this machine); aggregate or filter more")
            if time.monotonic() > deadline:
                self.stop()
                raise SqlError(timeout_message or "the trace store took too long to open for run_sql")

    # ---- queries ------------------------------------------------------------------------------

    def run(self, sql: str, limit: int, timeout_s: float) -> SqlResult:
        """Run one query in the child: its SqlResult, or SqlError (the engine's message, the timeout, the memory
        limit). At most one query runs at a time; another waits its turn within its own timeout."""
        if not self._lock.acquire(timeout=timeout_s):
            raise SqlError(f"another run_sql query was still running after {timeout_s:g} s; try again")
        try:
            changed = self._proc is not None and self.fingerprint() != self._stamp and \
                time.monotonic() - self._started >= self.reopen_min_s
            if self._proc is None or self._proc.poll() is not None or changed:
                self.stop()
                self._start()
            assert self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write(json.dumps({"sql": sql, "limit": limit, "timeout_s": timeout_s}) + "\n")
                self._proc.stdin.flush()
            except OSError as exc:
                self.stop()
                raise SqlError(f"the query process could not take the query: {exc.strerror or exc}") from exc
            timeout = f"query stopped after the {timeout_s:g} s timeout; aggregate or filter more"
            reply = self._wait(time.monotonic() + timeout_s + GRACE_S, timeout)
        finally:
            self._lock.release()
        if "error" in reply:
            raise SqlError(reply["error"])
        return SqlResult(**reply["result"])


def _serve(db_path: str, settings: dict[str, str]) -> int:
    """The child: open the store with the limits, then answer one JSON line per query until stdin closes."""
    from ingero_mcp.mcp.sql import run_query
    from ingero_mcp.store import StoreError, open_store

    Path(settings["temp_directory"]).mkdir(mode=0o700, exist_ok=True)
    parent = os.getppid()

    def orphaned() -> None:  # the server is gone (killed, crashed): so is this, even mid-query
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()

    def say(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")  # ASCII: no text can break the pipe's encoding
        sys.stdout.flush()

    try:
        con = open_store(db_path, settings=settings)
        run_query(con, "SELECT 1", limit=1, timeout_s=START_TIMEOUT_S)  # warm: the first cursor's views take ~0.5 s
    except (StoreError, SqlError) as exc:
        say({"error": str(exc)})
        return 0
    say({"ready": True})
    for line in sys.stdin:
        ask = json.loads(line)
        try:
            got = run_query(con, ask["sql"], limit=ask["limit"], timeout_s=ask["timeout_s"])
            say({"result": asdict(got)})
        except SqlError as exc:
            say({"error": str(exc)})
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1], json.loads(sys.argv[2])))
