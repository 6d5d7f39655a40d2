"""A large store without its derived rows is finished once as a copy in the cache folder (analysis/finished.py): the
report from the copy is the store's own, the store is never written, a later open reads the copy, a changed store gets
a copy of its own, the folder keeps to its size, and where no copy can be made the store is read as before. The size
threshold is set to 0 here (the shipped stores are small); the v1 store has no derived rows."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path

import pytest
from paths import REPO

from ingero_mcp.analysis import finished
from ingero_mcp.cli import main
from ingero_mcp.mcp.handle import StoreHandle
from ingero_mcp.store import open_store
from ingero_mcp.store.views import has_derived

V1 = REPO / "investigations" / "h200-seed-benchmark-v1.duckdb"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(finished, "FINISH_FROM", 0)
    monkeypatch.setenv(finished.CACHE_ENV, str(tmp_path / "cache"))
    db = tmp_path / "v1.duckdb"
    shutil.copyfile(V1, db)
    return db


def _explain(db: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["explain", "--db", str(db), "--json"]) == 0
    return capsys.readouterr().out


def _copies(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").glob("*.duckdb"))


def _file_of(con) -> str:  # type: ignore[no-untyped-def]
    return con.execute("SELECT file FROM pragma_database_list WHERE name = current_database()").fetchall()[0][0]


def test_the_copy_says_what_the_store_says(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    monkeypatch.setenv(finished.CACHE_ENV, "off")
    plain = _explain(store, capsys)
    assert not (tmp_path / "cache").exists()
    monkeypatch.setenv(finished.CACHE_ENV, str(tmp_path / "cache"))
    assert _explain(store, capsys) == plain
    (copy,) = _copies(tmp_path)
    con = open_store(copy)
    try:
        assert has_derived(con)
    finally:
        con.close()
    made = copy.stat().st_mtime_ns
    os.utime(copy, ns=(made - 10**9, made - 10**9))
    assert _explain(store, capsys) == plain  # read from the copy: none made again, the copy marked as used
    assert _copies(tmp_path) == [copy] and copy.stat().st_mtime_ns > made - 10**9
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before, "the store itself is never written"
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")], "no half-made copy left"


def test_a_changed_store_gets_its_own_copy_and_the_folder_keeps_its_size(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _explain(store, capsys)
    (first,) = _copies(tmp_path)
    st = store.stat()
    os.utime(store, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file changed (its time, here)
    monkeypatch.setenv(finished.CACHE_MB_ENV, "0")  # room for the newest only
    _explain(store, capsys)
    (second,) = _copies(tmp_path)
    assert second != first


def test_no_copy_where_none_can_be_made(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A cache folder that cannot be made (a file in its place): the store is read as it is, the report the same."""
    monkeypatch.setenv(finished.CACHE_ENV, "off")
    plain = _explain(store, capsys)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(finished.CACHE_ENV, str(blocker / "cache"))
    assert _explain(store, capsys) == plain
    con = finished.open_finished(store)
    try:
        assert _file_of(con) == str(store)
    finally:
        con.close()


def test_the_mcp_server_serves_the_copy_made_on_a_thread(store: Path, tmp_path: Path) -> None:
    """The server's store opened at once (its `initialize` does not wait), the copy made on a thread; the first
    call waits for it and reads the copy."""
    handle = StoreHandle(store)
    try:
        assert any(t.name == "ingero-store-finish" for t in threading.enumerate()) or _copies(tmp_path)
        with handle.connection() as cur:
            (copy,) = _copies(tmp_path)
            assert _file_of(cur) == str(copy)
    finally:
        handle.close()
