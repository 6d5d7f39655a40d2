"""`ingero-mcp report`: the HTML report opened in a real headless browser (Debian's chromium via Playwright).

It must load with no console error, request nothing beyond its own file, and its charts must hold
one series per part of a feeding thread's second (plus GPU utilisation) with a point per second of
the accounting, and the host chart a point per second of snapshots.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hostile import bad_chars, hostile_store

from ingero_mcp.analysis.report import build_report
from ingero_mcp.cli import main
from ingero_mcp.demo import generate
from ingero_mcp.store import open_store

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "investigations" / "h200-seed-benchmark-v1.duckdb"
CHROMIUM = os.environ.get("INGERO_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def _browser_or_skip():
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("playwright (pip install -e '.[test]')")
        sync_playwright = None
    if not shutil.which(CHROMIUM):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail("CI needs: " + ", ".join(missing))
        pytest.skip("no headless browser: " + ", ".join(missing))
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which(CHROMIUM), args=ARGS)
        yield b
        b.close()


def open_page(browser, path: Path, shot: Path | None = None) -> tuple[object, list, list]:
    """Load the report; every request that is not the file itself is recorded and refused."""
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list = []
    requests: list = []
    page.on("console", lambda m: errors.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))

    def route(r):
        if r.request.url != path.as_uri():
            requests.append(r.request.url)
            return r.abort()
        return r.continue_()

    page.route("**/*", route)
    page.goto(path.as_uri())
    page.wait_for_function("window.ingeroCharts !== undefined", timeout=20_000)
    if shot:
        page.screenshot(path=str(shot))
    return page, errors, requests


def expected(db: Path) -> tuple[list[int], int]:
    """Points per feeding thread (its accounted seconds) and the host chart's seconds with snapshots."""
    con = open_store(db)
    try:
        report = build_report(con)
        from ingero_mcp.analysis.accounting import origin_ns

        t0 = origin_ns(con)
        lo, hi = report.window.start_ns, report.window.end_ns
        host = con.execute(f"SELECT count(DISTINCT (ts_ns - {t0}) // 1000000000) FROM snapshots "
                           f"WHERE ts_ns BETWEEN {lo} AND {hi}").fetchall()[0][0]
    finally:
        con.close()
    return [len(t.seconds) for t in report.accounting.threads if t.role == "feeder"], host


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("report") / "dataloader.duckdb"
    generate("dataloader", db, scale=0.3)
    return db


@pytest.mark.parametrize("which", ["h200", "demo"])
def test_report_in_browser(which: str, browser, demo_db: Path, tmp_path: Path) -> None:
    db = {"h200": H200, "demo": demo_db}[which]
    out = tmp_path / "report.html"
    assert main(["report", "--db", str(db), "-o", str(out)]) == 0
    assert out.stat().st_size < 5_000_000
    page, errors, requests = open_page(browser, out)
    assert errors == []
    assert requests == [], "the report asks for nothing over the network (nor any other file)"
    shapes = page.evaluate("window.ingeroCharts.map(c => c.data.datasets.map(d => [d.label, d.data.length]))")
    threads, host = expected(db)
    assert len(shapes) == len(threads) + 1
    for shape, seconds in zip(shapes, threads):
        assert [label for label, _ in shape] == ["running outside CUDA", "in CUDA (on CPU or waiting for the GPU)",
                                                 "waiting for a CPU", "sleeping (lock, queue, IO)", "GPU utilisation %"]
        assert all(n == seconds for _, n in shape) and seconds > 0
    assert [label for label, _ in shapes[-1]] == ["GPU utilisation %", "host CPU %"]
    assert all(n == host for _, n in shapes[-1])
    # Drawn: each chart's canvas has a size and its chart its metadata
    assert page.evaluate("window.ingeroCharts.every(c => c.width > 100 && c.height > 100)")
    text = page.inner_text("body")
    assert "Causal chains" in text and "Processes" in text
    if which == "demo":
        # the culprits on hover: the tooltip footer of a second names who held the CPU and who woke the thread
        footer = page.evaluate("window.ingeroCharts[0].options.plugins.tooltip.callbacks.footer([{dataIndex: 5}])")
        assert "CPU held by: " in footer and "pt_data_worker" in footer
        assert page.locator("details pre").count() > 0, "the SQL behind each number"
    page.close()


def test_hostile_strings_are_text(browser, tmp_path: Path) -> None:
    """Traced names reach the page cleaned and escaped: no markup of theirs, no control characters."""
    db = hostile_store(tmp_path / "hostile.duckdb")
    out = tmp_path / "h.html"
    assert main(["report", "--db", str(db), "-o", str(out)]) == 0
    page, errors, requests = open_page(browser, out)
    assert errors == [] and requests == []
    assert not bad_chars(page.inner_text("body").replace("\t", " "), allow_newline=True)  # tabs: innerText between cells
    assert page.locator("script").count() == 3
    page.close()


def test_screenshot_for_readme(browser, demo_db: Path, tmp_path: Path) -> None:
    """The README's picture is taken by this browser (INGERO_SCREENSHOT=path writes it)."""
    target = os.environ.get("INGERO_SCREENSHOT")
    out = tmp_path / "report.html"
    assert main(["report", "--db", str(demo_db), "-o", str(out)]) == 0
    page, errors, _ = open_page(browser, out, Path(target) if target else tmp_path / "shot.png")
    assert errors == []
    page.close()
