"""A fresh clone needs nothing beside it: Ingero's traces ship in tests/data/ingero unchanged, nothing reads
`../shared`, `.ci/run` runs as root or re-runs itself under sudo (one line when it can do neither), and
`.ci/pytest` counts "no tests collected" as a failure."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest

from paths import INGERO_DIR, REPO

NOBODY = 65534
SHIPPED = {  # Ingero's published files and their sha256, as tests/data/ingero/README.md lists them
    "pytorch-dataloader-starvation.db": "835fd2ebdca65f2db5b1af84752836e6148308089b684b9e304bc14927479f4e",
    "sample-cluster.db": "f522f7d1f996b88833b1888008351b8d1da00108cf31a16f44c4061c53ba6b5b",
    "sample-gpu-node-01.db": "f7d1cc3fc63ece405492762bf989ebb1e9557d9665987bf25ab6d29da3bd860d",
}


def test_ingero_traces_ship_unchanged_with_their_notice() -> None:
    notice = (INGERO_DIR / "README.md").read_text()
    assert "https://github.com/ingero-io/ingero" in notice and "Apache License 2.0" in notice
    for name, digest in SHIPPED.items():
        assert hashlib.sha256((INGERO_DIR / name).read_bytes()).hexdigest() == digest, name
        assert digest in notice, name
    assert sorted(p.name for p in INGERO_DIR.iterdir()) == sorted([*SHIPPED, "README.md"])  # no -shm/-wal


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_trace_opens_alone(name: str, tmp_path: Path) -> None:
    """The .db alone (no -shm/-wal beside it) is a whole database: integrity ok, its events readable."""
    copy = tmp_path / name
    shutil.copyfile(INGERO_DIR / name, copy)
    con = sqlite3.connect(f"{copy.as_uri()}?mode=ro", uri=True)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] in (3807, 600, 200)
    con.close()


def test_nothing_reads_outside_the_repository() -> None:
    """No test, product code, benchmark or CI script opens ../shared (the issue-19 clone had no such folder)."""
    readers = re.compile(r"""parent\s*/\s*["']shared["']|\.\./shared|["']shared["']\s*/\s*["']ingero-investigations""")
    offenders = []
    for folder in ("src", "tests", "bench", ".ci"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".sh", ""} and path.name != Path(__file__).name:
                text = path.read_text(errors="replace")
                offenders += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in readers.finditer(text)]
    assert offenders == []


def _as_nobody(cmd: list[str], path: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`cmd` run as the unprivileged user nobody with PATH=`path` (setpriv drops root for real)."""
    env = {"PATH": path, "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    full = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]
    return subprocess.run(full, capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_ci_run_as_a_user_without_sudo_says_so_in_one_line() -> None:
    proc = _as_nobody(["bash", str(REPO / ".ci" / "run")], "/usr/bin:/bin", REPO)
    assert proc.returncode == 1
    assert proc.stdout == ""  # it stopped before installing anything
    assert proc.stderr.count("\n") == 1 and "needs root" in proc.stderr and "bash .ci/run" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_ci_run_as_a_user_with_sudo_runs_itself_under_sudo() -> None:
    """This machine has no sudo; a stand-in on PATH records how .ci/run called it (and runs nothing). Its folder
    is one nobody can reach (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="ci-sudo-"))
    try:
        folder.chmod(0o777)
        record = folder / "sudo-args"
        (folder / "sudo").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
        (folder / "sudo").chmod(0o755)
        proc = _as_nobody(["bash", str(REPO / ".ci" / "run"), "-x"], f"{folder}:/usr/bin:/bin", REPO)
        assert proc.returncode == 0, proc.stderr
        assert record.read_text().splitlines() == ["CI=1", "bash", str(REPO / ".ci" / "run"), "-x"]
    finally:
        shutil.rmtree(folder)


def _ci_pytest(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / ".ci" / "pytest"), "-p", "no:cacheprovider", str(folder)],
                          capture_output=True, text=True, timeout=120)


def test_ci_pytest_counts_no_tests_collected_as_a_failure(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "test_nothing.py").write_text("VALUE = 1\n")
    proc = _ci_pytest(empty)
    assert proc.returncode == 1, proc.stdout
    assert "no tests ran" in proc.stdout and "collected no tests" in proc.stderr


def test_ci_pytest_passes_and_fails_as_pytest_does(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    (good / "test_ok.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    (bad / "test_no.py").write_text("def test_no():\n    assert 1 + 1 == 3\n")
    assert _ci_pytest(good).returncode == 0
    assert _ci_pytest(bad).returncode == 1
