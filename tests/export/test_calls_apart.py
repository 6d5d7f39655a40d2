"""A large export's CUDA calls encoded by a second process (export/calls_apart.py): what it writes is checked against
the goldens by test_perfetto_same_events; here, what happens when it cannot do its part, and when it is not used."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from paths import REPO

from ingero_mcp.cli import main
from ingero_mcp.export import calls_apart
from ingero_mcp.store import open_store

SEED = REPO / "investigations" / "h200-seed-benchmark.duckdb"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    copy = tmp_path / "store.duckdb"
    shutil.copyfile(SEED, copy)
    return copy


def test_a_failing_child_fails_the_export_in_one_line(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The child given a track layout without the threads' sequences fails; the export says so (exit 2, one line,
    the child's reason), writes no output and leaves no part file."""
    monkeypatch.setattr(calls_apart, "APART_FROM", 0)
    send = calls_apart.CallsApart.send
    monkeypatch.setattr(calls_apart.CallsApart, "send",
                        lambda self, scope, thread_seq, seq_of, origin: send(self, scope, {}, seq_of, origin))
    out = tmp_path / "run.pftrace"
    assert main(["export", "--db", str(db), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "encoding the CUDA calls failed (exit code 1)" in err[0], err
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name not in ("store.duckdb", "store.duckdb.wal")]


def test_few_calls_are_encoded_here(db: Path, tmp_path: Path) -> None:
    """Under APART_FROM calls in scope no child is started (its start-up would cost more than it saves)."""
    con = open_store(db)
    try:
        from ingero_mcp.export.events import Scope

        assert calls_apart.start(con, db, tmp_path / "x.pftrace", Scope()) is None
        calls = con.execute("SELECT count(*) FROM cuda_calls").fetchall()[0][0]
    finally:
        con.close()
    assert 0 < calls < calls_apart.APART_FROM
