"""`ingero-mcp explain` and `ingero-mcp query` as a user runs them: text, JSON, filters, windows, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_fixtures import S, T0, contention_store
from ingero_mcp.cli import main


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return contention_store(tmp_path_factory.mktemp("cli") / "c.duckdb")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_text_report(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "--db", str(db))
    assert code == 0
    assert "HIGH" in out and "cudaStreamSynchronize" in out and "stress[200]" in out
    assert "Root cause" in out and "Timeline" in out and "Fix" in out
    assert "Top CUDA ops" in out and "Processes" in out and "pt_data_worker" in out


def test_explain_json_keys(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "--db", str(db), "--json")
    assert code == 0
    doc = json.loads(out)
    stat = doc["stats"][0]
    assert {"op", "count", "p50_ns", "p95_ns", "p99_ns", "max_ns"} <= set(stat)
    proc = next(p for p in doc["processes"] if p["pid"] == 100)
    assert {"pid", "comm", "context_switches", "off_cpu_ns", "page_allocs", "ops"} <= set(proc)
    chain = doc["chains"][0]
    assert {"op", "severity", "p50_ns", "p99_ns", "tail_ratio", "root_cause", "evidence", "recommendations",
            "timeline"} <= set(chain)
    assert chain["op"] == "cudaStreamSynchronize" and chain["severity"] == "HIGH"


def test_explain_filters_and_windows(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "explain", "--db", str(db), "--json", "--pid", "200", "--pid", "101")
    doc = json.loads(out)
    assert sorted(p["pid"] for p in doc["processes"]) == [101, 200] and doc["stats"] == [] and doc["chains"] == []
    _, out, _ = run(capsys, "explain", "--db", str(db), "--json", "--pid", "99999")
    assert any("99999" in note for note in json.loads(out)["notes"])
    _, out, _ = run(capsys, "explain", "--db", str(db), "--json", "--since", "3s")
    doc = json.loads(out)
    assert doc["window"] == {"start_ns": T0 + 7 * S, "end_ns": T0 + 10 * S}
    assert not any(c["op"] == "cudaStreamSynchronize" for c in doc["chains"])  # the slow syncs were at 5-6 s
    _, out, _ = run(capsys, "explain", "--db", str(db), "--json", "--from", "5.5s", "--to", "3.5s")
    doc = json.loads(out)
    assert doc["window"] == {"start_ns": T0 + 4500 * 1_000_000, "end_ns": T0 + 6500 * 1_000_000}
    assert any(c["op"] == "cudaStreamSynchronize" for c in doc["chains"])


def test_explain_per_process_and_sql(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "explain", "--db", str(db), "--per-process", "--sql")
    assert "pid 104 pt_data_worker" in out and "pid 200 stress" in out
    assert "SELECT" in out and "quantile_disc" in out


def test_explain_errors_are_one_line(tmp_path: Path, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", "--db", str(tmp_path / "nope.duckdb"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "no trace store" in err
    code, _, err = run(capsys, "explain", "--db", str(db), "--since", "yesterday")
    assert code == 2 and "cannot read duration" in err and "Traceback" not in err


def test_query_table_json_limit(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "query", "--db", str(db), "SELECT op, count(*) AS n FROM cuda_calls GROUP BY op ORDER BY n DESC")
    assert code == 0 and "cudaLaunchKernel" in out and "1000" in out and "4 rows" in out
    code, out, _ = run(capsys, "query", "--db", str(db), "--json", "--limit", "3", "SELECT pid FROM processes ORDER BY pid")
    doc = json.loads(out)
    assert doc == {"columns": ["pid"], "rows": [[100], [101], [102]], "truncated": True}
    code, out, _ = run(capsys, "query", "--db", str(db), "--json", "DESCRIBE cuda_calls")
    assert code == 0 and ["ts_ns", "BIGINT"] == json.loads(out)["rows"][1][:2]


def test_query_errors_name_the_tables(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "query", "--db", str(db), "SELECT * FROM cuda_cals")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "cuda_calls" in err and "host_aggregates" in err and "Traceback" not in err
    code, _, err = run(capsys, "query", "--db", str(db), "DELETE FROM cuda_calls")
    assert code == 2 and "read-only" in err
    code, _, err = run(capsys, "query", "--db", str(db), "SELECT * FROM read_csv('/etc/passwd')")
    assert code == 2
    code, out, _ = run(capsys, "query", "--db", str(db), "--json", "SELECT count(*) FROM cuda_calls")
    assert json.loads(out)["rows"] == [[2000]]  # nothing was deleted


def test_help_has_examples() -> None:
    for cmd in ("explain", "query"):
        got = subprocess.run([sys.executable, "-m", "ingero_mcp.cli", cmd, "--help"], capture_output=True, text=True)
        assert got.returncode == 0 and "examples:" in got.stdout and "--db" in got.stdout


def test_explain_on_an_empty_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ingero_mcp.store import TraceWriter

    db = tmp_path / "empty.duckdb"
    with TraceWriter(db):
        pass
    code, out, _ = run(capsys, "explain", "--db", str(db))
    assert code == 0 and "empty trace" in out
    code, out, _ = run(capsys, "explain", "--db", str(db), "--json")
    assert code == 0 and json.loads(out)["chains"] == []
    code, _, err = run(capsys, "explain", "--db", str(db), "--since", "3s")
    assert code == 2 and "empty" in err


def test_hostile_process_names_are_printed_as_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ingero_mcp.store import TraceWriter

    db = contention_store(tmp_path / "hostile.duckdb")
    with TraceWriter(db, session_id=1) as w:
        w.replace("processes", {"pid": [100, 200], "ppid": [1, 1], "comm": ["[bold red]py[/]", "st\x1b[2Jress\u202e"]})
    code, out, _ = run(capsys, "explain", "--db", str(db), "--per-process")
    assert code == 0 and "[bold red]py[/]" in out  # shown literally, not as markup
    assert "\x1b" not in out and "\u202e" not in out
    code, out, _ = run(capsys, "query", "--db", str(db), 'SELECT comm AS "[/x]" FROM processes ORDER BY pid')
    assert code == 0 and "[bold red]py[/]" in out and "[/x]" in out and "\x1b" not in out
