"""The trace store: one DuckDB file per trace, plus Parquet segments while it is being recorded.

Writers go through `TraceWriter` (columnar batches only); readers through `open_store`
(read-only, file + live segments seen as one set of tables). The reader is imported on first
use, so recording works on a host that has pyarrow but no DuckDB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ingero_mcp.store.errors import StoreError
from ingero_mcp.store.schema import SCHEMA_VERSION, TABLES
from ingero_mcp.store.writer import TraceWriter, fold_segments, segment_dir

if TYPE_CHECKING:
    from ingero_mcp.store.reader import open_store

__all__ = ["SCHEMA_VERSION", "TABLES", "StoreError", "TraceWriter", "fold_segments", "open_store", "segment_dir"]


def __getattr__(name: str) -> Any:
    if name == "open_store":
        from ingero_mcp.store.reader import open_store

        return open_store
    raise AttributeError(name)
