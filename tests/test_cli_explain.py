"""`ingero-mcp explain` and `ingero-mcp query` as a user runs them: text, JSON, filters, windows, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_fixtures import S, contention_store
from ingero_mcp.cli import main


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return contention_store(tmp_path_factory.mktemp("cli") / "c.duckdb")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cpu-contention at half scale: 15 s, ffmpeg holds the 4 CPUs from +4 s to +11 s."""
    from ingero_mcp.demo import generate

    db = tmp_path_factory.mktemp("cli") / "cc.duckdb"
    generate("cpu-contention", db, scale=0.5)
    return db


def test_explain_text_report(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "--db", str(demo))
    assert code == 0
    # the verdict comes first: who fed the GPU and where its time went, then the causes
    verdict = out.index("Verdict")
    assert verdict < out.index("Time accounting") < out.index("Causal chains") < out.index("Top CUDA ops")
    assert 'process "python3"[8100]\'s main thread fed the GPU' in out[verdict:out.index("Time accounting")]
    assert "ffmpeg[8200]" in out and "Root cause" in out and "Fix" in out and "Processes" in out


def test_explain_json_keys(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "--db", str(demo), "--json")
    assert code == 0
    doc = json.loads(out)
    assert {"verdict", "accounting", "minor", "chains", "stats", "processes", "window", "notes"} <= set(doc)
    assert doc["verdict"][0].startswith('process "python3"[8100]\'s main thread fed the GPU')
    assert isinstance(doc["minor"], list)
    acc = doc["accounting"]
    assert acc["complete"] is True
    main = next(t for t in acc["threads"] if t["tid"] == 8100)
    assert main["role"] == "feeder" and len(main["seconds"]) == 15
    parts = ("run_outside_ns", "run_inside_ns", "sleep_inside_ns", "sleep_outside_ns", "cpu_wait_inside_ns",
             "cpu_wait_outside_ns", "off_cpu_unknown_ns")
    for sec in main["seconds"]:
        assert sum(sec[p] for p in parts) == sec["wall_ns"] and {"k", "start_ns", "gpu_util_percent"} <= set(sec)
    assert sum(s["wall_ns"] for s in main["seconds"]) == main["total"]["wall_ns"]
    assert {p["kind"] for p in acc["phases"]} <= {"baseline", "slow", "recurrent"}
    chain = doc["chains"][0]
    assert {"id", "severity", "root_cause", "summary", "seconds_lost", "window", "culprits", "evidence",
            "recommendations"} <= set(chain)
    contention = next(c for c in doc["chains"] if c["root_cause"] == "cpu-contention")
    assert contention["culprits"][0]["comm"] == "ffmpeg" and contention["culprits"][0]["pid"] == 8200
    stat = doc["stats"][0]
    assert {"op", "count", "p50_ns", "p95_ns", "p99_ns", "max_ns"} <= set(stat)


def test_explain_filters_and_windows(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = 1_768_471_200 * S
    _, out, _ = run(capsys, "explain", "--db", str(demo), "--json", "--pid", "8200")  # ffmpeg: not traced
    doc = json.loads(out)
    assert [p["pid"] for p in doc["processes"]] == [8200] and doc["stats"] == [] and doc["chains"] == []
    assert doc["accounting"]["threads"] == []
    _, out, _ = run(capsys, "explain", "--db", str(demo), "--json", "--pid", "99999")
    assert any("99999" in note for note in json.loads(out)["notes"])
    _, out, _ = run(capsys, "explain", "--db", str(demo), "--json", "--since", "3s")
    doc = json.loads(out)
    assert doc["window"] == {"start_ns": t0 + 12 * S, "end_ns": t0 + 15 * S}
    assert not any(c["root_cause"] == "cpu-contention" for c in doc["chains"])  # ffmpeg ended at +11 s
    assert all(len(t["seconds"]) == 3 for t in doc["accounting"]["threads"])
    # --from/--to count back from the end: the hog's seven seconds
    _, out, _ = run(capsys, "explain", "--db", str(demo), "--json", "--from", "11s", "--to", "4s")
    doc = json.loads(out)
    assert doc["window"] == {"start_ns": t0 + 4 * S, "end_ns": t0 + 11 * S}
    first = doc["chains"][0]
    assert first["root_cause"] == "cpu-contention" and first["severity"] == "HIGH"
    assert first["culprits"][0]["comm"] == "ffmpeg"
    assert t0 + 4 * S <= first["window"]["start_ns"] and first["window"]["end_ns"] <= t0 + 11 * S


def test_explain_per_process_and_sql(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "explain", "--db", str(demo), "--per-process", "--sql")
    assert "pid 8100 python3" in out and "ffmpeg" in out
    assert "SELECT" in out and "thread_seconds" in out  # the evidence's SQL, over the accounting's views


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
