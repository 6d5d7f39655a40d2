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
from paths import REPO

from ingero_mcp.analysis.report import build_report
from ingero_mcp.cli import main
from ingero_mcp.demo import generate
from ingero_mcp.store import open_store

H200 = REPO / "investigations" / "h200-seed-benchmark-v1.duckdb"
BUNDLED = REPO / "investigations" / "h200-seed-benchmark.duckdb"
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
    """Points per feeding thread (its accounted seconds), the verdict's thread first, and the host chart's seconds
    with snapshots."""
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
    feeders = [t for t in report.accounting.threads if t.role == "feeder"]
    first = next(t for t in feeders if t.pid == report.processes[0].pid and t.tid == t.pid)  # the verdict's: main
    return [len(first.seconds)] + [len(t.seconds) for t in feeders if t is not first], host


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("report") / "dataloader.duckdb"
    generate("dataloader", db, scale=0.3)
    return db


@pytest.mark.parametrize("which", ["h200", "bundled", "demo"])
def test_report_in_browser(which: str, browser, demo_db: Path, tmp_path: Path) -> None:
    db = {"h200": H200, "bundled": BUNDLED, "demo": demo_db}[which]
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
        assert [label.removesuffix(" (incl. kernel launches, entry-only)") for label, _ in shape] == [
            "running outside CUDA", "in CUDA (on CPU or waiting for the GPU)",
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
    # tabs: innerText between cells
    assert not bad_chars(page.inner_text("body").replace("\t", " "), allow_newline=True)
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


# --- issue 19, item 2: chain windows shaded, units in tooltips, the verdict's thread first, sortable tables, kernel
# threads folded ------------------------------------------------------------------------------------------------------

PIXEL = """([i, frac, n]) => {
  const c = window.ingeroCharts[n || 0], a = c.chartArea, x = c.scales.x, r = c.currentDevicePixelRatio;
  const step = x.getPixelForValue(1) - x.getPixelForValue(0);
  const px = x.getPixelForValue(i) + 0.42 * step, py = a.top + frac * (a.bottom - a.top);  // between two bars
  return Array.from(c.ctx.getImageData(Math.round(px * r), Math.round(py * r), 1, 1).data);
}"""


def column(page, table: str, col: int) -> list[str | None]:
    """The data-v (sort value) of one column's cells, in row order."""
    return page.evaluate(f"Array.from(document.querySelectorAll('{table} tbody tr')).map(r => r.cells[{col}]"
                         ".getAttribute('data-v'))")


def test_report_shades_windows_labels_units_and_sorts(browser, tmp_path: Path) -> None:
    import re

    out = tmp_path / "bundled.html"
    assert main(["report", "--db", str(BUNDLED), "-o", str(out)]) == 0
    page, errors, requests = open_page(browser, out)
    assert errors == [] and requests == []
    con = open_store(BUNDLED)
    try:
        report = build_report(con)
    finally:
        con.close()
    # the verdict's thread first: the main thread of the process the verdict names
    title = page.evaluate("window.ingeroCharts[0].options.plugins.title.text")
    assert "(tid 2111, pid 2111" in title and "the thread the verdict names" in title
    assert report.verdict[0].startswith('process "python3"[2111]\'s main thread')
    # every chain of the process with a window is shaded on its thread's chart and on the host chart
    windows = page.evaluate("window.ingeroCharts.map(c => c.options.plugins.chainWindows.windows)")
    chains = [c for c in report.chains if c.window and 2111 in c.pids]
    assert len(windows[0]) == len(chains) == len(windows[-1]) == 4
    high = next(w for w in windows[0] if w["severity"] == "HIGH")
    assert high["label"] == "HIGH host-bound" and high["to"] - high["from"] == 32  # +11 s to +44 s: 33 seconds
    inside = page.evaluate(PIXEL, [(high["from"] + high["to"]) // 2, 0.42])
    # a second no window covers, on the host's chart (the thread's seconds end at its last CUDA call's, in a window)
    host = len(windows) - 1
    labels = page.evaluate(f"window.ingeroCharts[{host}].data.labels.length")
    free = [k for k in range(labels) if not any(w["from"] <= k <= w["to"] for w in windows[-1])]
    assert free, (labels, windows[-1])
    outside = page.evaluate(PIXEL, [free[-1], 0.42, host])
    assert inside[3] > 20 and inside[0] > inside[1] + 60, inside  # drawn: the HIGH red, translucent
    assert outside[3] == 0, outside  # nothing drawn beyond the windows
    # units in the tooltips: ms of each second for the parts, % for utilisation; the second in its title
    label = "window.ingeroCharts[{c}].options.plugins.tooltip.callbacks.label({{dataset: window.ingeroCharts[{c}]" \
            ".data.datasets[{d}], parsed: {{y: 12.5}}}})"
    assert page.evaluate(label.format(c=0, d=0)).endswith("12.5 ms of the second")
    assert "12.5 % busy" in page.evaluate(label.format(c=0, d=4))
    assert "12.5 % of all CPUs busy" in page.evaluate(label.format(c=1, d=1))
    assert "+12 s from the trace start" in page.evaluate(
        "window.ingeroCharts[0].options.plugins.tooltip.callbacks.title([{label: '12s'}])")
    # sortable: a click on a header sorts by its numbers, a second click reverses
    page.click("table.procs thead th:nth-child(4)")  # context switches
    values = [float(v) for v in column(page, "table.procs", 3)]
    assert values == sorted(values) and values[0] < values[-1]
    page.click("table.procs thead th:nth-child(4)")
    assert [float(v) for v in column(page, "table.procs", 3)] == sorted(values, reverse=True)
    page.click("table.procs thead th:nth-child(5)")  # off-CPU, thread-seconds: unknown ('-') sorts first
    off = [float(v) if v else float("-inf") for v in column(page, "table.procs", 4)]
    assert off == sorted(off) and max(off) > 600  # python3's 637 thread-seconds
    assert "thread-s" in page.inner_text("table.procs thead")
    # kernel threads folded into one row, named in it; the job's processes keep their rows
    from ingero_mcp.export.html import is_kernel_thread

    names = page.evaluate("Array.from(document.querySelectorAll('table.procs tbody tr'))"
                          ".map(r => r.cells[1].innerText)")
    kernel = re.compile(r"(kworker|ksoftirqd|migration|swapper|rcu_|cpuhp|watchdog|UVM )")
    folded = [n for n in names if n.startswith("kernel threads (")]
    assert len(folded) == 1 and not [n for n in names if kernel.match(n)]
    n = int(folded[0].split("(")[1].split(")")[0])
    assert n == sum(map(is_kernel_thread, report.processes)) > 50
    assert not any(is_kernel_thread(p) for p in report.processes if p.comm in ("python3", "pt_data_worker", "bash"))
    page.click("table.procs details summary")
    listed = page.inner_text("table.procs details")
    assert "kworker/" in listed and "rcu_preempt[15]" in listed and "UVM " in listed
    assert len(names) == len(report.processes) - n + 1
    page.close()


def test_a_finding_with_frames_draws_its_flame_graph(browser, tmp_path: Path) -> None:
    """Issue 21: a finding that names its code carries an inline SVG flame graph (no script, nothing fetched): the
    frame of interest (write_checkpoint) spans its IO sleep, the kernel's fsync frames sit under it, and a
    finding of a store without stacks draws none."""
    from stack_fixtures import checkpoint_store, no_stacks_store

    db = checkpoint_store(tmp_path / "ckpt.duckdb")
    out = tmp_path / "ckpt.html"
    assert main(["report", "--db", str(db), "-o", str(out)]) == 0
    page, errors, requests = open_page(browser, out, tmp_path / "ckpt.png")
    assert errors == [] and requests == []
    first = page.locator("section.chain").first
    assert "write_checkpoint (ckpt.py:30)" in first.locator(".code p").inner_text()
    svg = first.locator("svg.flame").first
    assert svg.is_visible()
    frame = svg.locator("g.frame", has=page.locator("title", has_text="write_checkpoint"))
    assert frame.count() == 1
    share = float(frame.get_attribute("data-share"))
    assert share == 100.0  # the IO finding's graph: its IO sleeps, all in write_checkpoint
    box = frame.locator("rect").bounding_box()
    whole = svg.bounding_box()
    assert box and whole and 0.98 <= box["width"] / whole["width"] <= 1.0
    assert svg.locator("g.frame", has=page.locator("title", has_text="do_fsync")).count() == 1
    assert page.locator("script").count() == 3  # the flame graph added none
    page.close()
    plain = tmp_path / "none.html"
    assert main(["report", "--db", str(no_stacks_store(tmp_path / "none.duckdb")), "-o", str(plain)]) == 0
    assert "<svg" not in plain.read_text()
