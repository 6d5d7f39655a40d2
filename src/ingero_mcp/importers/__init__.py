"""Importers: traces recorded by other tools, written into the trace store without loss.

`import_ingero(src, dst)` reads an Ingero SQLite trace database (schema 0.8 / 0.9).
"""

from ingero_mcp.importers.ingero import ImportSummary, Progress, import_ingero
from ingero_mcp.importers.ingero_source import IngeroImportError

__all__ = ["ImportSummary", "IngeroImportError", "Progress", "import_ingero"]
