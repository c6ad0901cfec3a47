"""``lockgate console`` in a real browser against a running two-app pipeline.

examples/click_pipeline.py runs as two click_app and two region_app processes fed by a
steady click stream; ``lockgate console`` runs as its own process; headless Chromium
(Debian's package, driven by Playwright for Python) opens the console and checks what an
operator would:

* both apps are shown with their four key groups each, owned by the running instances;
* a checkpoint completes and appears: the latest completed checkpoint shown for an app
  changes while the page stays open (the live refresh, no reload);
* a savepoint trigger without the token is refused (401) and nothing leaks the token;
* a savepoint triggered from the page with the token appears in the savepoint list, and
  its page (``savepoint describe``) opens;
* the dashboard page (the chart's Grafana dashboard drawn by the console): the records-in
  rate panel shows a positive rate for the click app's instances, its chart gains points
  without a reload, and every panel shows data or says why not.

``make test`` installs Chromium first (tests/support/ensure-chromium.sh) and sets
``LOCKGATE_TEST_REQUIRE_BROWSER=1``: a missing browser fails there. Run alone, the test
skips (naming the reason) when no Chromium is found and it cannot be installed.

With ``LOCKGATE_TEST_CONSOLE_SCREENSHOT=PATH`` the test saves a screenshot of the console there
(docs/images/console.png is made that way), with ``LOCKGATE_TEST_DASHBOARD_SCREENSHOT=PATH``
one of the dashboard page (docs/images/dashboard.png).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos._pipeline import (
    CLICK_SPEC,
    REGION_SPEC,
    ClickFeeder,
    PipelineFleet,
    Topics,
    pipeline_env,
    read_topic,
)
from tests.integration._util import http_get
from tests.support.browser import REQUIRE_ENV, ensure_chromium
from tests.support.kafka import create_topic
from tests.support.ports import free_port
from tests.support.procs import LOCKGATE, ROOT, wait_until

PARTITIONS = 4
TOKEN = "console-test-token-1234"
SCREENSHOT_ENV = "LOCKGATE_TEST_CONSOLE_SCREENSHOT"
DASHBOARD_SCREENSHOT_ENV = "LOCKGATE_TEST_DASHBOARD_SCREENSHOT"


def _browser_or_skip() -> tuple[Any, str]:
    """Return (playwright's sync_playwright, chromium path), or skip/fail saying why."""
    required = os.environ.get(REQUIRE_ENV) == "1"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            pytest.fail("playwright is not installed (pip install -e '.[test]')")
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    path = ensure_chromium()
    if path is None:
        reason = (
            "no Chromium found and it cannot be installed here (not root): install Debian's "
            "chromium package (tests/support/ensure-chromium.sh) or set LOCKGATE_TEST_CHROMIUM"
        )
        if required:
            pytest.fail(reason)
        pytest.skip(reason)
    return sync_playwright, path


def _fleets(bootstrap: str, topics: Topics, root: Path, **common: str) -> list[PipelineFleet]:
    return [
        PipelineFleet(spec, pipeline_env(bootstrap, topics, app, **common), root, ids, ports=True)
        for spec, app, ids in (
            (CLICK_SPEC, topics.click_app, ["c1", "c2"]),
            (REGION_SPEC, topics.region_app, ["r1", "r2"]),
        )
    ]


def _start_console(
    bootstrap: str, sp_dir: Path, port: int, fleets: list[PipelineFleet], log: Path
) -> subprocess.Popen[bytes]:
    args = [str(LOCKGATE), "console", "--port", str(port), "--refresh", "0.5"]
    args += ["--scrape-interval", "1"]
    for fleet in fleets:
        for iid, p in fleet.ports.items():
            args += ["--instance", f"{iid}=http://127.0.0.1:{p}"]
    env = {
        **os.environ,
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_QUERY_TOKEN": TOKEN,
        "LOCKGATE_LOG_FORMAT": "console",
    }
    with log.open("ab") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def test_console_in_a_real_browser(kafka_bootstrap: str, tmp_path: Path) -> None:
    sync_playwright, chromium = _browser_or_skip()
    topics = Topics.fresh("console")
    create_topic(kafka_bootstrap, topics.clicks, PARTITIONS)
    create_topic(kafka_bootstrap, topics.counts, PARTITIONS)
    sp_dir = tmp_path / "savepoints"
    common = {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "500", "LOCKGATE_SAVEPOINT_DIR": str(sp_dir)}
    fleets = _fleets(kafka_bootstrap, topics, tmp_path, **common)
    feeder = ClickFeeder(kafka_bootstrap, topics.clicks, 10**6, rate=150, users=40, regions=5)
    port = free_port()
    console_log = tmp_path / "console.log"
    console: subprocess.Popen[bytes] | None = None
    started = time.monotonic()
    try:
        for fleet in fleets:
            fleet.start_all()
        feeder.start()
        read_topic(kafka_bootstrap, topics.totals, expected=50, timeout=90, idle=0)
        console = _start_console(kafka_bootstrap, sp_dir, port, fleets, console_log)
        wait_until(lambda: http_get(port, "/healthz")[0] == 200, timeout=30, what="console up")
        url = f"http://127.0.0.1:{port}/"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url)
                _check_apps(page, topics)
                _check_checkpoint_advances(page, topics.click_app)
                dashboard_started = time.monotonic()
                _check_dashboard(page, url)
                print(f"dashboard check: {time.monotonic() - dashboard_started:.1f} s")
                page.goto(url)
                _check_savepoint(page, topics)
                shot = os.environ.get(SCREENSHOT_ENV)
                if shot:
                    page.goto(url)
                    page.wait_for_selector(f'section.app[data-app="{topics.region_app}"]')
                    page.screenshot(path=shot, full_page=True)
                assert TOKEN not in page.content()
            except Exception as exc:
                overview = http_get(port, "/api/overview")[1]
                overview = http_get(port, "/api/jobs")[1] + "\n" + overview
                log = console_log.read_text(errors="replace")[-3000:]
                raise AssertionError(
                    f"{exc}\n--- /api/overview ---\n{overview[:4000]}\n--- console log ---\n{log}"
                ) from exc
            finally:
                browser.close()
    finally:
        feeder.stop()
        if console is not None:
            console.terminate()
            console.wait(30)
        for fleet in fleets:
            fleet.stop_all()
    log_text = console_log.read_text(errors="replace")
    assert TOKEN not in log_text
    print(f"console browser test: {time.monotonic() - started:.1f} s")


def _check_apps(page: Any, topics: Topics) -> None:
    """Both apps, four key groups each, every key group owned by a running instance."""
    for app, ids in ((topics.click_app, {"c1", "c2"}), (topics.region_app, {"r1", "r2"})):
        section = f'section.app[data-app="{app}"]'
        page.wait_for_selector(section, timeout=60_000)
        table = f'table.key-groups[data-app="{app}"]'

        def owned(table: str = table, ids: set[str] = ids) -> bool:
            rows = page.locator(f"{table} tbody tr")
            owners = {rows.nth(i).locator("td").nth(1).inner_text() for i in range(rows.count())}
            return rows.count() == PARTITIONS and owners == ids

        wait_until(owned, timeout=90, interval=0.5, what=f"{app}: 4 key groups on {ids}")
        cells = page.locator(f"{table} td[data-key-group]").all_inner_texts()
        assert sorted(cells) == ["0", "1", "2", "3"], cells
    graph = page.locator("svg#graph").inner_html()
    for name in (topics.click_app, topics.region_app, topics.clicks, topics.counts):
        assert name[:12] in graph, (name, graph[:500])


def _check_checkpoint_advances(page: Any, app: str) -> None:
    """The latest completed checkpoint shown changes without a reload."""
    latest = page.locator(f'.latest-checkpoint[data-app="{app}"]')
    wait_until(
        lambda: re.fullmatch(r"\d+", latest.inner_text().strip()) is not None,
        timeout=60,
        interval=0.5,
        what="a completed checkpoint on the page",
    )
    first = int(latest.inner_text())
    wait_until(
        lambda: (
            re.fullmatch(r"\d+", latest.inner_text().strip()) is not None
            and int(latest.inner_text()) > first
        ),
        timeout=30,
        interval=0.5,
        what="a newer completed checkpoint on the page",
    )
    rows = page.locator(f'table.checkpoints[data-app="{app}"] tbody tr')
    assert rows.count() >= 1


def _check_dashboard(page: Any, url: str) -> None:
    """The dashboard page: a live records rate that updates without a reload."""
    page.goto(url + "dashboard")
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    panel = page.locator('section.panel[data-title="Records in / s"]')

    def rates() -> dict[str, float]:
        rows = panel.locator("tr.legend-row")
        return {
            str(rows.nth(i).get_attribute("data-name")): float(
                rows.nth(i).get_attribute("data-last") or "nan"
            )
            for i in range(rows.count())
        }

    wait_until(
        lambda: {"c1", "c2"} <= {n for n, v in rates().items() if v > 0},
        timeout=60,  # two rounds kept per instance; a loaded machine keeps them slowly
        interval=0.5,
        what="a positive records-in rate of c1 and c2 on the dashboard",
    )
    line = panel.locator('polyline.series[data-name="c1"]')

    def points() -> int:
        return len((line.get_attribute("points") or "").split()) if line.count() else 0

    first = points()
    wait_until(
        lambda: points() >= first + 2,
        timeout=20,
        interval=0.5,
        what="the records-in chart gains points without a reload",
    )
    assert navigations == [], navigations
    # No panel is blank: each shows data, or a note that says why not.
    panels = page.locator("section.panel")
    assert panels.count() >= 12
    for i in range(panels.count()):
        p = panels.nth(i)
        if p.get_attribute("data-state") != "data":
            assert p.locator(".panel-note").count() > 0, p.inner_html()[:500]
    shot = os.environ.get(DASHBOARD_SCREENSHOT_ENV)
    if shot:
        page.screenshot(path=shot, full_page=True)


def _check_savepoint(page: Any, topics: Topics) -> None:
    """Refused without the token; with it, the savepoint appears in the list."""
    page.fill("#trigger-pipeline", topics.click_app)
    page.click("#trigger-button")
    msg = page.locator("#msg")
    # Polled from here: the page's CSP forbids eval, which wait_for_function's strings need.
    wait_until(lambda: "401" in msg.inner_text(), timeout=10, what="401 without the token")
    assert page.locator("td[data-savepoint]").count() == 0
    page.fill("#token", TOKEN)
    page.click("#trigger-button")
    wait_until(lambda: "started" in msg.inner_text(), timeout=10, what="the trigger accepted")
    page.wait_for_selector("td[data-savepoint]", timeout=120_000)
    sid = page.locator("td[data-savepoint]").first.get_attribute("data-savepoint")
    assert sid
    jobs = page.locator("table.jobs").inner_text()
    assert "completed" in jobs, jobs
    with page.expect_navigation():
        page.click(f'td[data-savepoint="{sid}"] a')
    assert page.locator("#savepoint-id").inner_text() == sid
    text = page.locator("main").inner_text()
    assert topics.click_app in text and topics.region_app in text, text[:1000]
    page.go_back()
