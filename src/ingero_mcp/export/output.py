"""Writing an output file whole or not at all, with an error a user can act on when the path is wrong."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from ingero_mcp.store.errors import OutputError

T = TypeVar("T")


def check_output(out: str | os.PathLike[str]) -> Path:
    """`out` as a Path, or OutputError where it cannot be a file we write: checked before the work, not after."""
    final = Path(out)
    if final.is_dir():
        raise OutputError(f"{final} is a directory: give a file name (in it, or elsewhere)")
    if not final.parent.is_dir():
        raise OutputError(f"cannot write {final}: directory {final.parent} does not exist")
    if not os.access(final.parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {final}: no permission to create files in {final.parent}")
    return final


def write_whole(out: str | os.PathLike[str], write: Callable[[IO[Any]], T], mode: str = "wb",
                encoding: str | None = None) -> T:
    """Run `write` on a temporary file beside `out`, then rename it to `out`: a reader never sees half a file,
    and a failed write leaves neither. Raises OutputError naming the path and the reason (callers run
    check_output first, before their work)."""
    final = Path(out)
    tmp = final.parent / f".{final.name}.tmp"
    try:
        with open(tmp, mode, encoding=encoding) as f:
            result = write(f)
        os.replace(tmp, final)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return result
