"""A finished store records the answers of the report's costly questions (schemas/v7.sql: acct_answers); readers read
them back only for the same SQL over the same store rows (analysis/answers.py)."""

from __future__ import annotations

import math
import shutil
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from ingero_mcp.analysis import diagnose
from ingero_mcp.analysis.answers import STORED, decode, encode, recording, shared_rows
from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.analysis.window import trace_window
from ingero_mcp.demo import generate
from ingero_mcp.store import open_store
from ingero_mcp.store.views import SAME_ROWS_AS

MARK = 987654321  # a call count no demo store has


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("answers") / "dataloader.duckdb"
    generate("dataloader", db, scale=0.3)
    return db


def _report(db: Path, window: TimeWindow | None = None) -> str:
    con = open_store(db)
    try:
        return diagnose(con, window).model_dump_json()
    finally:
        con.close()


def _tamper(db: Path) -> None:
    """The recorded per-(pid, op) call groups say one group had MARK calls: a reader that reads them shows it."""
    con = duckdb.connect(str(db))
    key, answer = con.execute(f"SELECT query_key, answer FROM {STORED} "
                              "WHERE sql LIKE 'SELECT pid, op, min(api) AS api, count(*) AS calls%'").fetchall()[0]
    got = decode(answer)
    got[0] = got[0][:3] + (MARK,) + got[0][4:]
    con.execute(f"UPDATE {STORED} SET answer = ? WHERE query_key = ?", [encode(got), key]).fetchall()
    con.close()


def test_recorded_answers_are_what_their_sql_gives(store: Path) -> None:
    con = open_store(store)
    recorded = con.execute(f"SELECT sql, answer FROM {STORED}").fetchall()
    assert len(recorded) >= 10
    sqls = " ".join(sql for sql, _ in recorded)
    for asked in ("quantile_disc(duration_ns", "call_class IN ('launch', 'launch_first')", "FROM sched_intervals"):
        assert asked in sqls
    for sql, answer in recorded:
        assert sorted(decode(answer), key=repr) == sorted(con.execute(sql).fetchall(), key=repr), sql
    con.close()


def test_report_reads_them_back_for_the_whole_trace_only(store: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.duckdb"
    shutil.copy(store, plain)
    con = duckdb.connect(str(plain))
    con.execute(f"DELETE FROM {STORED}").fetchall()
    con.close()
    want = _report(plain)  # every question asked of the rows
    assert _report(store) == want
    assert str(MARK) not in want

    tampered = tmp_path / "tampered.duckdb"
    shutil.copy(store, tampered)
    _tamper(tampered)
    assert str(MARK) in _report(tampered)  # read back, not asked again
    con = open_store(plain)
    whole = trace_window(con)
    con.close()
    assert whole is not None
    part = TimeWindow(start_ns=whole.start_ns, end_ns=whole.end_ns - 1)
    assert str(MARK) not in _report(tampered, part)  # another window: other SQL, asked of the rows
    assert _report(tampered, part) == _report(plain, part)


def test_not_read_once_the_store_changed(store: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered.duckdb"
    shutil.copy(store, tampered)
    _tamper(tampered)
    assert str(MARK) in _report(tampered)
    con = duckdb.connect(str(tampered))  # an append after the store was finished (its derived rows go stale too)
    con.execute("INSERT INTO cuda_calls BY NAME SELECT * EXCLUDE (kernel_handle) FROM cuda_calls LIMIT 1").fetchall()
    con.close()
    assert str(MARK) not in _report(tampered)


def _made_with(db: Path, made_with: str) -> None:
    """The recorded answers say they were made with the definitions hashed `made_with`."""
    con = duckdb.connect(str(db))
    con.execute(f"UPDATE {STORED} SET made_from = regexp_replace(made_from, ' [0-9a-f]+$', ' ' || ?)",
                [made_with]).fetchall()
    con.close()


def test_answers_made_with_definitions_that_make_the_same_rows_are_read(store: Path, tmp_path: Path) -> None:
    """Answers recorded before a rewrite of the views that views.SAME_ROWS_AS vouches for are still the answers;
    those of other definitions are not read."""
    for made_with, read in ((sorted(SAME_ROWS_AS)[-1], True), ("0123456789abcdef", False)):
        tampered = tmp_path / f"{made_with}.duckdb"
        shutil.copy(store, tampered)
        _tamper(tampered)
        _made_with(tampered, made_with)
        assert (str(MARK) in _report(tampered)) == read, made_with


def test_encoding_keeps_values_and_types() -> None:
    got = [(1, 2**70, -3.25, math.inf, math.nan, Decimal("1.50"), "a'\"\n", None, True, [1, None, [2.5]],
            {"a": (1, "x"), "b": None}, (4, 5))]
    back = decode(encode(got))  # type: ignore[arg-type]
    assert repr(back[0][:4]) == repr(got[0][:4]) and math.isnan(back[0][4])
    assert back[0][5:] == got[0][5:]
    assert [type(v) for v in back[0]] == [type(v) for v in got[0]]
    assert encode([(0.1 + 0.2,)]) == "[[0.30000000000000004]]"
    import datetime

    assert encode([(datetime.date(2026, 1, 1),)]) is None  # not kept exactly: not recorded (asked again)


def test_answers_kept_for_the_process_follow_the_store(store: Path, tmp_path: Path) -> None:
    """Answers worked out in this process are reused while the store is unchanged, and not once rows are added."""
    from ingero_mcp.analysis.calls import call_groups

    plain = tmp_path / "plain.duckdb"
    shutil.copy(store, plain)
    con = duckdb.connect(str(plain))
    con.execute(f"DELETE FROM {STORED}").fetchall()
    con.close()

    def launches() -> int:
        con = open_store(plain)
        try:
            return sum(g.count for g in call_groups(con) if g.pid is None and g.op == "cudaLaunchKernel")
        finally:
            con.close()

    before = launches()
    assert launches() == before
    con = duckdb.connect(str(plain))
    con.execute("INSERT INTO cuda_calls BY NAME SELECT * EXCLUDE (kernel_handle) FROM cuda_calls "
                "WHERE op = 'cudaLaunchKernel' LIMIT 1")
    con.close()
    assert launches() == before + 1


def test_a_question_asked_twice_while_recorded_runs_once() -> None:
    """Two findings over one window ask one question: the finish runs it once (a sequence counts the runs), and a
    question with parameters is not recorded (a recorded answer's SQL must recompute it alone)."""
    con = duckdb.connect()
    con.execute("CREATE SEQUENCE runs START 1").fetchall()
    with recording() as asked:
        first = shared_rows(con, "SELECT nextval('runs')")
        again = shared_rows(con, "SELECT nextval('runs')")
        assert shared_rows(con, "SELECT ?::INTEGER + 1", [41]) == [(42,)]
    assert first == again == [(1,)]
    assert [sql for sql, _ in asked.values()] == ["SELECT nextval('runs')"]
    assert con.execute("SELECT nextval('runs')").fetchall() == [(2,)]
