"""Remake docs/report.png: the HTML report of the dataloader demo in headless chromium (Debian's), as the tests load it.

    .venv/bin/python docs/screenshot.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from ingero_mcp.cli import main

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
OUT = Path(__file__).resolve().parent / "report.png"

with tempfile.TemporaryDirectory() as tmp:
    db, html = Path(tmp) / "demo-dataloader.duckdb", Path(tmp) / "report.html"
    main(["demo", "dataloader", "--db", str(db), "--no-report"])
    main(["report", "--db", str(db), "-o", str(html)])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        page.route("**/*", lambda r: r.continue_() if r.request.url == html.as_uri() else r.abort())
        page.goto(html.as_uri())
        page.wait_for_function("window.ingeroCharts && window.ingeroCharts.length > 0")
        box = page.locator("canvas").first.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.42, box["y"] + box["height"] * 0.55)  # a tooltip with culprits
        page.wait_for_timeout(300)
        page.screenshot(path=str(OUT))
        browser.close()
print(f"wrote {OUT}")
