"""The trace store: one DuckDB file per trace, plus Parquet segments while it is being recorded.

Writers go through `TraceWriter` (columnar batches only); readers through `open_store`
(read-only, file + live segments seen as one set of tables). Each is imported on first use, so
recording works on a host that has pyarrow but no DuckDB, and reading does not load pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ingero_mcp.store.errors import StoreError
from ingero_mcp.store.schema import SCHEMA_VERSION, TABLES
from ingero_mcp.store.segments import segment_dir

if TYPE_CHECKING:
    from ingero_mcp.store.reader import open_store
    from ingero_mcp.store.writer import TraceWriter, fold_segments

__all__ = ["SCHEMA_VERSION", "TABLES", "StoreError", "TraceWriter", "fold_segments", "open_store", "segment_dir"]


def __getattr__(name: str) -> Any:
    """The reader (DuckDB) and the writer (pyarrow) load on first use: a reader does not pay for pyarrow, a recording
    host without DuckDB can still write."""
    if name == "open_store":
        from ingero_mcp.store.reader import open_store

        return open_store
    if name in ("TraceWriter", "fold_segments"):
        from ingero_mcp.store import writer

        return getattr(writer, name)
    raise AttributeError(name)
