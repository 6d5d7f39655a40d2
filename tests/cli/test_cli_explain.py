"""`ingero-mcp explain` and `ingero-mcp query` as a user runs them: text, JSON, filters, windows, errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_fixtures import S, contention_store
from ingero_mcp.cli import main
from paths import REPO


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return contention_store(tmp_path_factory.mktemp("cli") / "c.duckdb")


def flat(text: str) -> str:
    """Text with its line breaks and indents folded into single spaces (output wraps to the width)."""
    return " ".join(text.split())


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
    code, out, _ = run(capsys, "explain", "--db", str(demo), "--full")
    assert code == 0
    out = flat(out)
    # the verdict comes first: who fed the GPU and where its time went, then the causes
    verdict = out.index("Verdict")
    assert verdict < out.index("Time accounting") < out.index("Causal chains") < out.index("Top CUDA ops")
    assert 'process "python3"[8100]\'s main thread fed the GPU' in out[verdict:out.index("Time accounting")]
    assert "ffmpeg[8200]" in out and "Root cause" in out and "Fix" in out and "Processes" in out
    # by default: the verdict, then each finding with its culprit and fix, the top ops; the detail is --full's
    code, short, _ = run(capsys, "explain", "--db", str(demo))
    short = flat(short)
    assert code == 0 and short.index("Verdict") < short.index("1. HIGH cpu-contention") < short.index("Top CUDA ops")
    assert "who: ffmpeg[8200] (other process" in short and "fix: " in short and "Root cause" not in short


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
    for alone in ("--sql", "--per-process"):  # each implies --full: the evidence is what the SQL recomputes
        _, out, _ = run(capsys, "explain", "--db", str(demo), alone)
        assert "Evidence" in out and "Root cause" in out


def test_explain_errors_are_one_line(tmp_path: Path, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", "--db", str(tmp_path / "nope.duckdb"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "no trace store" in err
    code, _, err = run(capsys, "explain", "--db", str(db), "--since", "yesterday")
    assert code == 2 and "cannot read duration" in err and "Traceback" not in err


def test_query_table_json_limit(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "query", "--db", str(db),
                       "SELECT op, count(*) AS n FROM cuda_calls GROUP BY op ORDER BY n DESC")
    assert code == 0 and "cudaLaunchKernel" in out and "1000" in out and "4 rows" in out
    code, out, _ = run(capsys, "query", "--db", str(db), "--json", "--limit", "3",
                       "SELECT pid FROM processes ORDER BY pid")
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


# --- issue 19, item 2: the answer first, on one screen; --full keeps the detail; fitted to the width ----------------

BUNDLED = REPO / "investigations" / "h200-seed-benchmark.duckdb"
BUNDLED_V1 = REPO / "investigations" / "h200-seed-benchmark-v1.duckdb"
BOX_DRAWING = {chr(c) for c in range(0x2500, 0x2580)}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def explain(db: Path, *extra: str, columns: str | None = "100") -> str:
    """`ingero-mcp explain` as a user pipes it (stdout not a terminal), $COLUMNS as given."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    proc = subprocess.run([sys.executable, "-m", "ingero_mcp.cli", "explain", "--db", str(db), *extra],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def in_a_terminal(db: Path, columns: int, *extra: str) -> str:
    """`ingero-mcp explain` on a pseudo-terminal of `columns` columns, as typed in one: its raw output."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"TERM": "xterm-256color"}
    proc = subprocess.Popen([sys.executable, "-m", "ingero_mcp.cli", "explain", "--db", str(db), *extra],
                            stdin=follower, stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_default_explain_of_the_bundled_trace_fits_one_screen_piped() -> None:
    out = explain(BUNDLED)
    lines = out.splitlines()
    assert len(lines) <= 40, len(lines)
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert "\u2026" not in out and not BOX_DRAWING & set(out) and "\x1b" not in out  # nothing cut, plain text
    text = flat(out)
    report = json.loads(explain(BUNDLED, "--json"))
    high = next(c for c in report["chains"] if c["severity"] == "HIGH")
    # the verdict first: who fed the GPU, its progress in iterations
    assert text.index("Verdict") < text.index("1. HIGH") < text.index("Top CUDA ops")
    assert report["verdict"][0].startswith('process "python3"[2111]\'s main thread fed the GPU')
    assert report["verdict"][0] in text and "iterations/s at its baseline" in text
    # the HIGH finding: its cause, window and time explained, what was seen, culprit, and its one fix
    start = (high["window"]["start_ns"] - min(s["started_ns"] for s in report["info"]["sessions"])) / 1e9
    assert f"1. HIGH {high['root_cause']}: +{start:.1f} s to" in text
    assert f"{high['seconds_lost']:.1f} s of feeding time" in text and "culprit: its own work" in text
    assert high["summary"] in text
    fix = high["recommendations"][0]
    # the store has no stacks: where the time went is not known, so the fix does not assume batch preparation
    assert "fix: Make that work cheaper" in text and "DataLoader workers" in text and fix[fix.index(": ") + 3:] in text
    assert text.count("fix: ") == len([c for c in report["chains"] if c["severity"] in ("HIGH", "MEDIUM")])
    # the tracing cost in one line, the notes short, then where the detail is
    (cost,) = [line for line in lines if line.startswith("tracing cost: ")]
    assert "0.76%" in cost and "not an upper bound" in cost
    assert "--full" in lines[-1] and "--sql" in lines[-1] and "report -o" in lines[-1] and "mcp" in lines[-1]
    assert "It leaves out those tracepoints' work" not in text  # the caveat paragraph is --full's


def test_default_explain_fits_a_100_column_terminal() -> None:
    raw = in_a_terminal(BUNDLED, 100)
    assert "\x1b[" in raw  # a terminal gets colour
    lines = ANSI.sub("", raw).splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, (len(lines), max(map(len, lines)))
    assert "\u2026" not in raw and "1. HIGH host-bound" in ANSI.sub("", raw)
    narrow = ANSI.sub("", in_a_terminal(BUNDLED, 80)).splitlines()  # a narrower terminal: wrapped, never cut
    assert max(map(len, narrow)) <= 80 and "\u2026" not in "".join(narrow)


@pytest.mark.parametrize("db", [BUNDLED_V1, REPO / "investigations" / "h200-seed-benchmark-4cpu.duckdb"])
def test_default_explain_of_older_stores_stays_short(db: Path) -> None:
    """v1 stores probed both API layers: a runtime call's driver call is folded into the runtime call's row."""
    out = explain(db)
    lines = out.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, (len(lines), max(map(len, lines)))
    table = lines[lines.index(next(line for line in lines if line.startswith("Top CUDA ops"))) + 2:]
    rows = [line for line in table[:3] if line.startswith("  ") and line.strip()[0].isdigit()]
    assert rows and any(r.endswith("cudaMemcpyAsync (runtime)") for r in rows)
    assert not any(r.endswith("cuMemcpyHtoDAsync_v2 (driver)") for r in rows)  # inside cudaMemcpyAsync: counted once
    assert "counted once: " in flat(out) and "tracing cost: not recorded" in out


def test_full_keeps_the_detail_within_the_width() -> None:
    out = explain(BUNDLED, "--full")
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert not BOX_DRAWING & set(out) and "\x1b" not in out and "\u2026" not in out
    text = flat(out)
    for part in ("Verdict", "Time accounting", "Causal chains found by ingero-mcp: 4", "Evidence", "Root cause",
                 "Fix", "Top CUDA ops", "Host events", "Processes: CPU",
                 "Processes: family and memory", "Minor"):
        assert part in text, part
    assert "tracing cost (estimated: " in text and "It leaves out those tracepoints' work" in text  # the paragraph
    assert "summed over the process's threads, in thread-seconds" in text  # 637 s of off-CPU over 57 s: thread-s
    # every table row starts with its gutter: a wrapped cell never starts a line
    table_rows = [line for line in lines if line.startswith("| ")]
    assert len(table_rows) > 40
    assert any("637.4" in row for row in table_rows)  # the main process's off-CPU, in thread-seconds


def test_full_wraps_at_columns_when_set() -> None:
    lines = explain(BUNDLED, "--full", columns="140").splitlines()
    assert 100 < max(map(len, lines)) <= 140
    lines = explain(BUNDLED, columns=None).splitlines()  # piped, no $COLUMNS: 100
    assert max(map(len, lines)) <= 100


def test_explain_on_a_finished_store_loads_neither_pyarrow_nor_numpy() -> None:
    """Start-up: reading a finished store needs DuckDB and pydantic only; pyarrow (the writer's) and numpy (the
    span builder's, for stores without derived tables) cost ~0.3 s of imports that explain must not pay."""
    code = ("import contextlib, io, sys\n"
            "from ingero_mcp.cli import main\n"
            f"sys.argv = ['ingero-mcp', 'explain', '--db', {str(BUNDLED)!r}]\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n        main()\n    except SystemExit as exc:\n        assert not exc.code, exc.code\n"
            "assert 'verdict' in out.getvalue().lower() or 'fed the GPU' in out.getvalue(), out.getvalue()[:200]\n"
            "print(sorted(m for m in ('pyarrow', 'numpy') if m in sys.modules))\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.strip() == "[]", got.stdout


def test_explain_prints_each_findings_code(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: the default page names the function under each finding ('code:'), --full lists its top frames
    with self and inclusive shares and its heaviest stacks; a store without stacks prints neither."""
    from stack_fixtures import checkpoint_store, no_stacks_store

    monkeypatch.setenv("COLUMNS", "100")
    db = checkpoint_store(tmp_path / "ckpt.duckdb")
    _, out, _ = run(capsys, "explain", "--db", str(db))
    lines = out.splitlines()
    code = next(i for i, line in enumerate(lines) if line.startswith("   code: "))
    assert "io-wait" in next(x for x in reversed(lines[:code]) if re.match(r"\d+\. ", x))
    assert "blocked in write_checkpoint (ckpt.py:30), called from train_step (train.py:88)" in flat(out)
    assert "in the kernel in folio_wait_bit_common" in flat(out)
    _, full, _ = run(capsys, "explain", "--db", str(db), "--full")
    # the IO finding reads its IO sleeps only: all of them in write_checkpoint's fsync
    assert re.search(r"self 100%  incl 100%  write_checkpoint \(ckpt\.py:30\) <- train_step", full)
    assert re.search(r"kernel 100%  folio_wait_bit_common", full)
    assert "stack 100%  <module>; train_step; write_checkpoint; fsync;" in full
    lines, code = full.splitlines(), []
    for i, line in enumerate(lines):  # the Code sections: from their title to the panel's next part
        if line.startswith("| Code "):
            code += [x for x in lines[i + 1:] if not x.startswith(("| Fix ", "| Timeline "))][:12]
    assert len(code) >= 6
    for line in code:  # a wrapped frame never starts a line (the renderer's words or indent do)
        assert not line.removeprefix("| ").startswith(("write_checkpoint", "folio_wait", "_PyEval", "<module>")), line
    _, plain, _ = run(capsys, "explain", "--db", str(no_stacks_store(tmp_path / "none.duckdb")), "--full")
    assert "code:" not in plain and "Code" not in plain
