"""The trace store: one DuckDB file per trace, plus Parquet segments while it is being recorded.

Writers go through `TraceWriter` (columnar batches only); readers through `open_store`
(read-only, file + live segments seen as one set of tables).
"""

from ingero_mcp.store.errors import StoreError
from ingero_mcp.store.reader import open_store, segment_dir
from ingero_mcp.store.schema import SCHEMA_VERSION, TABLES
from ingero_mcp.store.writer import TraceWriter, fold_segments

__all__ = ["SCHEMA_VERSION", "TABLES", "StoreError", "TraceWriter", "fold_segments", "open_store", "segment_dir"]
