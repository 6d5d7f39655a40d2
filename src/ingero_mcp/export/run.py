"""One entry for the CLI and the MCP server: export a store's window to a timeline file."""

from __future__ import annotations

import os
from collections.abc import Callable

from ingero_mcp.analysis import TimeWindow
from ingero_mcp.export import events as ev
from ingero_mcp.export.output import check_output, write_whole

# The export streams its rows a batch at a time; DuckDB's sorts for them are what holds memory (1.2 GB at 10M
# events unbounded): capped here, a sort larger than the cap goes to DuckDB's temporary files.
EXPORT_DUCKDB = {"memory_limit": "512MB"}


def export_timeline(db: str | os.PathLike[str], out: str | os.PathLike[str], fmt: str = "perfetto",
                    window: TimeWindow | None = None, pids: list[int] | None = None,
                    since: str | None = None, start: str | None = None, end: str | None = None,
                    progress: Callable[[str, int, int | None], None] | None = None) -> dict[str, int]:
    """Write the timeline of `db` (window/pids as in explain) to `out`; returns the counts written.

    progress(stage, done, total or None): called as the Perfetto export's bulk goes out, a batch at a time."""
    from ingero_mcp.analysis import diagnose
    from ingero_mcp.analysis import resolve_window
    from ingero_mcp.analysis import open_finished

    check_output(out, reads=[db])
    con = open_finished(db, settings=EXPORT_DUCKDB)
    apart = None
    try:
        if window is None and (since or start or end):
            window = resolve_window(con, since=since, start=start, end=end)
        scope = ev.Scope(window=window, pids=pids)
        if fmt != "json":  # a second process encodes the calls (calls_apart), started before the chains are found
            from ingero_mcp.export import calls_apart

            apart = calls_apart.start(con, db, out, scope)
        chains = diagnose(con, window=window, pids=pids).chains
        timeline = ev.gather(con, scope, chains)
        if fmt == "json":
            from ingero_mcp.export.chrome_json import write_chrome_json

            counts = write_whole(out, lambda f: write_chrome_json(con, timeline, scope, f), "w", "ascii")
        else:
            from ingero_mcp.export.perfetto import write_perfetto

            counts = write_whole(out, lambda f: write_perfetto(con, timeline, scope, f, progress, apart))
        return counts
    finally:
        if apart is not None:
            apart.close()
        con.close()
