"""How many of `explain`'s questions on the bundled trace (README's quickstart) its recorded answers answer.

A finished store keeps the answers to the report's questions (acct_answers), keyed by each question's SQL text: a
change to a question's SQL leaves its recorded answer unused, and `explain` asks it of DuckDB again at every start
(13 of 47 questions, +0.1 s of the quickstart's ~0.55 s, after the seventeenth session's changes). This says how many
are asked beyond the recorded ones; `--refinish` records them anew (the store's rows untouched, the report checked
equal before and after, the file replaced only then).

    .venv/bin/python bench/bundled_answers.py              # asked N, answered by the store M
    .venv/bin/python bench/bundled_answers.py --refinish   # then commit the store if the report is unchanged
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "investigations" / "h200-seed-benchmark.duckdb"


def asked_and_recorded(db: Path) -> tuple[int, int, str]:
    """(questions `explain` asks, how many the store's recorded answers hold, the report as JSON)."""
    from ingero_mcp.analysis import diagnose
    from ingero_mcp.analysis.answers import _alike, made_from, recording
    from ingero_mcp.store import open_store
    from ingero_mcp.store.views import SOURCE_SQL

    con = open_store(db)
    try:
        with recording() as asked:
            report = diagnose(con)
        made = made_from(con.execute(SOURCE_SQL).fetchall()[0])
        alike = _alike(made)
        stored = {key for (key,) in con.execute(
            f"SELECT query_key FROM acct_answers WHERE made_from IN ({', '.join('?' * len(alike))})", alike).fetchall()}
    finally:
        con.close()
    return len(asked), len(set(asked) & stored), report.model_dump_json()


def refinish(db: Path) -> None:
    """Record the answers anew in a copy, check the report is the same, and put the copy in the store's place."""
    from ingero_mcp.analysis.derive import store_derived

    _, _, before = asked_and_recorded(db)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / db.name
        shutil.copyfile(db, copy)
        con = duckdb.connect(str(copy))
        try:
            store_derived(con)
            con.execute("CHECKPOINT").fetchall()
        finally:
            con.close()
        asked, recorded, after = asked_and_recorded(copy)
        if after != before:
            sys.exit("the report differs after re-finishing: the store is left as it was")
        shutil.copyfile(copy, db)
    print(f"re-finished {db}: {recorded} of {asked} questions recorded; the report is unchanged")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=BUNDLED)
    parser.add_argument("--refinish", action="store_true", help="record the answers anew (the report must not move)")
    args = parser.parse_args()
    os.environ.setdefault("INGERO_MCP_CACHE", "off")
    if args.refinish:
        refinish(args.db)
        return
    asked, recorded, _ = asked_and_recorded(args.db)
    print(f"{args.db}: explain asks {asked} questions, {recorded} answered by its recorded answers, "
          f"{asked - recorded} asked of DuckDB at every start")


if __name__ == "__main__":
    main()
