"""Writing an output file whole or not at all, never over a trace, with an error a user can act on.

An output (a report, a timeline) must not destroy an input: the store the command reads (same inode, however
the path is spelled) and any file that is a database (SQLite, DuckDB: another trace, an Ingero recording) or a
live trace's Parquet segment are refused. A regular file is written beside its name and renamed into place
after its data reached the disk; a character device or a pipe (`-o /dev/stdout`) is written in place, since a
rename would replace the device node itself. Every write, flush, sync and close error is reported: a full disk
(`-o /dev/full`) fails, it never reads as written.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from ingero_mcp.store.errors import OutputError

T = TypeVar("T")

_SQLITE_MAGIC = b"SQLite format 3\x00"


def database_kind(path: str | os.PathLike[str]) -> str | None:
    """What database `path` holds, from its first bytes ('an SQLite database', 'a DuckDB database', 'a Parquet
    file'), or None for anything else (a missing or unreadable file included)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return None
    if head.startswith(_SQLITE_MAGIC):
        return "an SQLite database"
    if head[8:12] == b"DUCK":
        return "a DuckDB database"
    if head.startswith(b"PAR1"):
        return "a Parquet file (a live trace's segment?)"
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(out: str | os.PathLike[str], reads: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """`out` as a Path, or OutputError where it cannot be a file we write: checked before the work, not after.

    `reads`: the stores the command reads; `out` may not be one of them (nor its write-ahead log)."""
    final = Path(out)
    for source in map(Path, reads):
        for guarded in (source, Path(f"{source}.wal")):
            if _same_file(final, guarded):
                raise OutputError(f"refusing to write {final}: it is the trace store this command reads "
                                  f"({guarded}); give another file name")
    if final.is_dir():
        raise OutputError(f"{final} is a directory: give a file name (in it, or elsewhere)")
    try:
        mode = os.stat(final).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from exc
    if mode is not None and stat.S_ISREG(mode):
        kind = database_kind(final)
        if kind:
            raise OutputError(f"refusing to write over {final}: it is {kind} (a trace?); give another file name, "
                              "or move that file away first")
        folder = Path(os.path.realpath(final)).parent  # the new file is renamed into the folder of what it replaces
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputError(f"cannot write {final}: no permission to create files in {folder}")
        return final
    if mode is not None:
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            if not os.access(final, os.W_OK):
                raise OutputError(f"cannot write {final}: no permission")
            return final  # written in place (write_whole)
        raise OutputError(f"refusing to write {final}: it is not a regular file, a pipe or a character device")
    if not final.parent.is_dir():
        raise OutputError(f"cannot write {final}: directory {final.parent} does not exist")
    if not os.access(final.parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {final}: no permission to create files in {final.parent}")
    return final


def write_whole(out: str | os.PathLike[str], write: Callable[[IO[Any]], T], mode: str = "wb",
                encoding: str | None = None) -> T:
    """Run `write` on a temporary file beside `out`, sync it, then rename it to `out`: a reader never sees half a
    file, and a failed write leaves neither. A pipe or character device is written in place. Raises OutputError
    naming the path and the reason (callers run check_output first, before their work)."""
    final = Path(out)
    try:
        st_mode = os.stat(final).st_mode
    except OSError:
        st_mode = None
    if st_mode is not None and (stat.S_ISCHR(st_mode) or stat.S_ISFIFO(st_mode)):
        return _write_in_place(final, write, mode, encoding)
    target = Path(os.path.realpath(final))  # a symbolic link's target is replaced, not the link
    if database_kind(target):  # it became one since check_output
        raise OutputError(f"refusing to write over {final}: it is {database_kind(target)}")
    tmp = target.parent / f".{target.name}.{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with open(tmp, mode, encoding=encoding) as f:
            result = write(f)
            f.flush()
            os.fsync(f.fileno())  # a full or failing disk says so here, not after the rename
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return result


def _write_in_place(final: Path, write: Callable[[IO[Any]], T], mode: str, encoding: str | None) -> T:
    """A pipe or character device: written directly, every error (ENOSPC at the flush or close) reported."""
    try:
        with open(final, mode, encoding=encoding) as f:
            result = write(f)
            f.flush()
    except OSError as exc:
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from exc
    return result
