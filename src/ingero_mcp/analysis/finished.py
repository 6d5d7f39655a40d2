"""A large store without its derived rows (an older version's, one whose fold did not finish it) finished once, as a
copy in the user's cache, so that every later open reads it as fast as a finished store.

Without the accounting's rows every process derives them again (at 10M events ~8 s and ~2.4 GB each time). The first
open of such a store now copies the file into the cache folder, brings the copy to the current schema and finishes
it as the collector's fold finishes a recording (derived rows, the whole trace's answers), then reads the copy; later
opens of the same file (same path, size, modification time, and the same definitions of the derived rows) read the
copy at once. The store itself is never written. Where the copy cannot be made (no room, no cache folder, a failure)
the store is read as before, its rows derived for the process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

import duckdb

from ingero_mcp.store import open_store
from ingero_mcp.store.schema import SCHEMA_VERSION, migrate
from ingero_mcp.store.segments import fsync_path, has_segments, remove_store_file
from ingero_mcp.store.views import SOURCE_SQL, has_derived, views_hash

log = logging.getLogger("ingero_mcp.analysis")

CACHE_ENV = "INGERO_MCP_CACHE"  # the folder of finished copies; "off": never make one
CACHE_MB_ENV = "INGERO_MCP_CACHE_MB"  # the most the folder holds (oldest copies removed first)
CACHE_MB = 8192
# Events (CUDA calls + scheduler intervals) from which a copy pays: under ~1M deriving per process costs under ~1 s.
FINISH_FROM = 1_000_000


def cache_dir() -> Path | None:
    """Where finished copies go: $INGERO_MCP_CACHE, else $XDG_CACHE_HOME/ingero-mcp/finished (~/.cache/...)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "no") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ingero-mcp" / "finished"


def open_finished(db: str | os.PathLike[str], settings: dict[str, str] | None = None,
                  make: bool = True) -> duckdb.DuckDBPyConnection:
    """`open_store(db)`, or its finished copy's connection where the store lacks its derived rows and is large (the
    copy made now where there is none and `make`)."""
    con = open_store(db, settings)
    copy = finished_copy(con, db, make)
    if copy is None:
        return con
    try:
        finished = open_store(copy, settings)
    except Exception as exc:  # a damaged copy: removed, the store read as it is
        log.warning("cannot read the finished copy %s (%s): reading %s as it is", copy, exc, db)
        remove_store_file(copy)
        return con
    con.close()
    return finished


def wants_copy(con: duckdb.DuckDBPyConnection, db: str | os.PathLike[str]) -> Path | None:
    """Where the finished copy of the store behind `con` is or would go; None where none is wanted: no cache folder,
    a live recording, a store with its derived rows, a small one."""
    path = Path(db)
    folder = cache_dir()
    if folder is None or has_segments(path) or not path.is_file() or has_derived(con):
        return None
    calls, intervals = con.execute(SOURCE_SQL).fetchall()[0][:2]
    if (calls or 0) + (intervals or 0) < FINISH_FROM:
        return None
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{SCHEMA_VERSION}\0"
                         f"{views_hash()}".encode()).hexdigest()[:32]
    return folder / f"{key}.duckdb"


def finished_copy(con: duckdb.DuckDBPyConnection, db: str | os.PathLike[str], make: bool = True) -> Path | None:
    """The finished copy of the store behind `con` (made now if there is none and `make`), or None where none is
    wanted (`wants_copy`) or it cannot be made."""
    final = wants_copy(con, db)
    if final is None:
        return None
    if final.is_file():
        os.utime(final)  # the newest used is the last removed
        return final
    if not make:
        return None
    path = Path(db)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        room = shutil.disk_usage(final.parent).free
        if room < 3 * path.stat().st_size:
            log.info("no room in %s for a finished copy of %s (%d MB free)", final.parent, path, room >> 20)
            return None
        return _make(path, final)
    except Exception as exc:  # the store is read as it is: its rows derived for the process, as before
        log.warning("cannot make a finished copy of %s in %s: %s", path, final.parent, exc)
        return None


def _make(path: Path, final: Path) -> Path:
    """Copy, migrate and finish `path` into `final` (appearing by a rename once complete); older copies beyond the
    folder's size removed."""
    from ingero_mcp.analysis.derive import store_derived

    t0 = time.monotonic()
    tmp = final.parent / f".{final.stem}.{os.getpid()}.duckdb"
    remove_store_file(tmp)
    try:
        shutil.copyfile(path, tmp)
        build = duckdb.connect(str(tmp))
        try:
            build.execute("SET enable_progress_bar = false").fetchall()
            migrate(build)
            store_derived(build)
            build.execute("CHECKPOINT").fetchall()
        finally:
            build.close()
        fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        remove_store_file(tmp)
        raise
    log.info("finished a copy of %s in %s (%.1f s)", path, final, time.monotonic() - t0)
    _trim(final.parent, keep=final)
    return final


def _trim(folder: Path, keep: Path) -> None:
    """Remove the least recently used copies until the folder holds at most INGERO_MCP_CACHE_MB."""
    try:
        limit = int(os.environ.get(CACHE_MB_ENV, CACHE_MB)) << 20
    except ValueError:
        limit = CACHE_MB << 20
    copies = sorted((f.stat().st_mtime, f) for f in folder.glob("*.duckdb") if not f.name.startswith("."))
    total = sum(f.stat().st_size for _, f in copies)
    for _, f in copies:
        if total <= limit:
            break
        if f != keep:
            total -= f.stat().st_size
            remove_store_file(f)

