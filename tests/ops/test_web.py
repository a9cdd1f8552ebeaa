"""The operator's web page (``celery semaphore serve``), ``celery semaphore held`` and the
Grafana dashboard, against one real prefork ``celery worker`` that also serves its metrics
port (where the page is served too).

The browser tests drive Debian's headless ``chromium`` through ``chromedriver`` (Selenium):
they skip, saying why, when either is missing, and fail under ``CI=true``.  With
``CELERY_SEMAPHORE_SCREENSHOTS=<dir>`` they save the documentation's screenshots there
(``CELERY_SEMAPHORE_SCREENSHOTS=docs`` rewrites docs/web-*.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from celery_semaphore import Semaphore
from celery_semaphore.ops import registry, web
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration.workers import Env, Worker, start_worker, wait_until
from tests.route import unavailable

from .conftest import run_cli
from .test_cli import closed_port
from .web_proj import SCRIPT_NAME, go_key

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token"
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
CHROMEDRIVER = ("chromedriver",)
#: a semaphore with a rate (10/m) that the worker knows from the registry (see ``site``)
RATED = "rated-metrics"


@dataclass
class Site:
    env: Env
    worker: Worker
    client: Celery
    #: the page served by `celery semaphore serve --allow-actions` (token TOKEN), and by the
    #: worker's metrics port (read-only)
    url: str
    worker_url: str
    redis: Any

    def sem(self, name: str = "web") -> Semaphore:
        return Semaphore(name, 1, redis=self.env.redis_url, key_prefix=self.env.prefix)

    def holders(self) -> list[str]:
        return [str(h.owner.get("task_id")) for h in self.sem().holders()]

    def waiters(self) -> list[str]:
        return [str(w.owner.get("task_id")) for w in self.sem().waiters()]

    def go(self, tag: str) -> None:
        self.redis.rpush(go_key(tag, self.env.prefix), "go")


@pytest.fixture(scope="module")
def site(redis_server: RedisServer) -> Iterator[Site]:
    metrics_port = closed_port()
    env = replace(
        Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), limit=1, lease=3.0),
        app_module="tests.ops.web_proj",
        extra={"semaphore_metrics_port": metrics_port, "semaphore_metrics_address": "127.0.0.1"},
    )
    client = env.client_app()
    # a semaphore with a rate, known to the worker through the registry, so that its exporter
    # serves the rate gauges the dashboard charts (the Celery layer takes no rate= yet)
    setup = env.redis()
    registry.record(setup, env.prefix, [registry.TaskUse(RATED, "web.rated", 5)], node="test")
    setup.close()
    rated = Semaphore(RATED, 5, rate="10/m", redis=env.redis_url, key_prefix=env.prefix)
    permit = rated.acquire(blocking=False)
    assert permit is not None
    assert permit.release()
    worker = start_worker(env, concurrency=2, name="web")
    port = closed_port()
    server, _ = web.start_server(client, port=port, address="127.0.0.1", token=TOKEN)
    redis_client = env.redis()
    try:
        yield Site(
            env,
            worker,
            client,
            f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{metrics_port}",
            redis_client,
        )
    finally:
        server.shutdown()
        server.server_close()
        worker.stop()
        delete_prefix(redis_client, env.prefix)
        redis_client.delete(env.queue)
        redis_client.close()
        client.close()


def get(url: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["X-Semaphore-Token"] = token
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            status = response.status
            ctype = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    return status, json.loads(raw) if ctype.startswith("application/json") else raw.decode()


@pytest.fixture
def two_tasks(site: Site) -> Iterator[Callable[[], tuple[str, str]]]:
    """Start "a" (holds "web") then "b" (waits, held by the worker's gate); both end at the
    test's end."""
    sent: list[str] = []

    def start() -> tuple[str, str]:
        a = site.client.send_task("web.hold", ("a",)).id
        sent.append("a")
        wait_until(lambda: site.holders() == [a], 20, what="task a holds 'web'")
        b = site.client.send_task("web.hold", ("b",)).id
        sent.append("b")
        wait_until(lambda: site.waiters() == [b], 20, what="task b waits for 'web'")
        return a, b

    yield start
    for tag in sent:
        site.go(tag)
    wait_until(lambda: not site.holders() and not site.waiters(), 20, what="'web' is free")
    for tag in sent:
        site.redis.delete(go_key(tag, site.env.prefix))


# -- HTTP -----------------------------------------------------------------------------------


def test_json_endpoints_show_what_the_cli_shows(site: Site, two_tasks: Any) -> None:
    a, b = two_tasks()
    status, listing = get(site.url + "/api/semaphores")
    assert status == 200
    assert listing["actions"] is True
    rows = {r["name"]: r for r in listing["semaphores"]}
    assert rows["web"]["used"] == 1
    assert rows["web"]["waiting"] == 1
    assert SCRIPT_NAME in rows
    status, detail = get(site.url + "/api/semaphore?name=web")
    assert status == 200
    assert [h["task_id"] for h in detail["holder_list"]] == [a]
    assert [(w["task_id"], w["position"]) for w in detail["waiter_list"]] == [(b, 0)]
    assert (detail["waiter_list"][0]["how"], detail["waiter_list"][0]["held_by"]) == (
        "held by a worker",
        site.worker.name,
    )
    assert detail["holder_list"][0]["host"] == site.worker.name
    status, explained = get(site.url + f"/api/explain?task_id={b}")
    assert status == 200
    assert explained["results"][0]["state"] == "waiting"
    assert "place in line: 0" in explained["results"][0]["text"]
    assert get(site.url + "/api/explain?task_id=nope")[0] == 404
    assert get(site.url + "/api/semaphore?name=nope")[0] == 404


def test_actions_need_the_token_and_are_logged(site: Site) -> None:
    url = site.url + "/api/actions/set-limit"
    for token in (None, "", "wrong", TOKEN + "x"):
        status, body = get(url, token, {"name": "web", "limit": 3})
        assert status == 403, body
        assert "X-Semaphore-Token" in body["error"]
    assert site.sem().inspect().limit_override is None
    status, body = get(url, TOKEN, {"name": "web", "limit": 3, "operator": "ann"})
    assert status == 200, body
    assert body["after"] == {**body["after"], "limit": 3, "source": "override"}
    status, body = get(url, TOKEN, {"name": "web", "limit": None})
    assert status == 200, body
    assert site.sem().inspect().limit_override is None
    assert get(url, TOKEN, {"name": "web", "limit": 0})[0] == 400
    assert get(url, TOKEN, {"name": "nope", "limit": 2})[0] == 404
    assert get(site.url + "/api/actions/release", TOKEN, {"name": "web", "token": "x"})[0] == 404
    result = run_cli(site.client, "audit", "web", "--json")
    entries = json.loads(result.output)
    assert [e["action"] for e in entries[:2]] == ["clear-limit", "set-limit"]
    assert entries[1]["detail"]["via"] == "web"
    assert entries[1]["detail"]["operator"] == "ann"
    assert entries[1]["detail"]["remote"] == "127.0.0.1"
    # a forced release from the page leaves its reason for the holder's heartbeat, as the
    # CLI's does (one implementation: celery_semaphore.ops.actions)
    held = site.sem().acquire(blocking=False)
    assert held is not None
    release = site.url + "/api/actions/release"
    status, body = get(release, TOKEN, {"name": "web", "token": held.token, "operator": "ann"})
    assert status == 200, body
    assert body["released"] == [{"token": held.token, "released": True}]
    reason = site.sem().release_reason(held.token) or ""
    assert reason.startswith("forced by ann via the web page (")
    assert "from 127.0.0.1)" in reason


def test_worker_metrics_port_serves_the_page_read_only_and_metrics(site: Site) -> None:
    status, page = get(site.worker_url + "/")
    assert status == 200
    assert "/static/app.js" in page
    status, listing = get(site.worker_url + "/api/semaphores")
    assert status == 200
    assert listing["actions"] is False
    assert "web" in {r["name"] for r in listing["semaphores"]}
    status, body = get(site.worker_url + "/api/actions/reset", TOKEN, {"name": "web"})
    assert status == 403
    assert "read-only" in body["error"]
    status, text = get(site.worker_url + "/metrics")
    assert status == 200
    assert 'celery_semaphore_limit{semaphore="web"} 1.0' in text


def test_serve_command(site: Site) -> None:
    """`celery semaphore serve` as an operator runs it: the token from the environment."""
    port = closed_port()
    args = [sys.executable, "-m", "celery", "-A", site.env.app_module, "semaphore", "serve"]
    env = {**site.env.environ(), web.TOKEN_ENV: TOKEN}
    bad = subprocess.run(
        [*args, "--token", "x"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2
    assert "--token is only used with --allow-actions" in bad.stderr
    proc = subprocess.Popen(
        [*args, "--port", str(port), "--allow-actions"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.strip() == f"serving the celery-semaphore page on http://127.0.0.1:{port}/"
        assert proc.stdout.readline().strip() == "actions allowed with the given token"
        status, listing = get(f"http://127.0.0.1:{port}/api/semaphores")
        assert status == 200
        assert listing["actions"] is True
        assert "web" in {r["name"] for r in listing["semaphores"]}
        body = {"name": "web", "limit": 2}
        assert get(f"http://127.0.0.1:{port}/api/actions/set-limit", None, body)[0] == 403
        assert site.sem().inspect().limit_override is None
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)


# -- celery semaphore held --------------------------------------------------------------------


def test_held_lists_the_gates_requests_that_inspect_reserved_does_not(
    site: Site, two_tasks: Any
) -> None:
    a, b = two_tasks()
    result = run_cli(site.client, "held", "--json", "-d", site.worker.name)
    assert result.exit_code == 0, result.output
    by_node = json.loads(result.output)
    held = by_node[site.worker.name]
    assert [(t["task_id"], t["task"], t["semaphore"], t["stage"]) for t in held] == [
        (b, "web.hold", "web", "held")
    ]
    assert held[0]["position"] == 0
    text = run_cli(site.client, "held", "-d", site.worker.name).output
    nobody = run_cli(site.client, "held", "-d", "nobody@nowhere", "-t", "0.3")
    assert nobody.exit_code == 1
    assert "no worker replied within 0.3s" in nobody.output
    assert f"{site.worker.name}: 1 task(s) held by the gate" in text
    assert b in text
    # what Celery's own tools show for them: not reserved (the gate takes them off the pool's
    # reserved list), not active; the holder is active
    inspect = site.client.control.inspect(destination=[site.worker.name], timeout=2)
    reserved = [r["id"] for r in (inspect.reserved() or {}).get(site.worker.name, [])]
    active = [r["id"] for r in (inspect.active() or {}).get(site.worker.name, [])]
    assert b not in reserved
    assert b not in active
    assert a in active
    # the same command through Celery's own CLI (an inspect command of the worker)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "celery", "-A", site.env.app_module),
            *("inspect", "semaphore_held", "-d", site.worker.name, "--json", "-t", "2"),
        ],
        env=site.env.environ(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    replies = json.loads(done.stdout)
    assert [t["task_id"] for t in replies[site.worker.name]] == [b]


# -- Grafana ---------------------------------------------------------------------------------

DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
METRIC = re.compile(r"\bcelery_semaphore_[a-z_]+")


def _expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from _expressions(value)
    elif isinstance(node, list):
        for value in node:
            yield from _expressions(value)


def _scraped(site: Site) -> set[str]:
    status, text = get(site.worker_url + "/metrics")
    assert status == 200
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(s.name for s in family.samples)
    return names


def test_grafana_dashboard_queries_name_metrics_of_a_live_scrape(
    site: Site, two_tasks: Any
) -> None:
    # make every event the dashboard charts happen on the worker: acquired, waited (held by
    # the gate), a time-out, a forced release (the holder's heartbeat finds its lease lost), a
    # killed pool child (its permit reclaimed), a release (hold time)
    a, b = two_tasks()
    busy = _scraped(site)  # partition gauges exist while a partition has holders or waiters
    timed_out = site.client.send_task("web.impatient")
    with pytest.raises(Exception, match=r"SemaphoreTimeout|waited"):
        timed_out.get(timeout=20)
    status, body = get(site.url + "/api/actions/release", TOKEN, {"name": "web", "task_id": a})
    assert status == 200, body
    wait_until(lambda: site.holders() == [b], 20, what="b granted after a's forced release")
    wait_until(
        lambda: "celery_semaphore_lease_lost_total" in _scraped(site),
        20,
        interval=0.2,
        what="a's heartbeat finds its permit gone (lease_lost)",
    )
    # the pool child running b (the permit's owner is the gate's process, which took it)
    pids: list[int] = []

    def running_b() -> bool:
        inspect = site.client.control.inspect(destination=[site.worker.name], timeout=1)
        active = (inspect.active() or {}).get(site.worker.name, [])
        pids[:] = [int(r["worker_pid"]) for r in active if r["id"] == b and r.get("worker_pid")]
        return bool(pids)

    wait_until(running_b, 20, what="b running in a pool child")
    assert pids[0] != site.worker.process.pid
    os.kill(pids[0], signal.SIGKILL)
    wait_until(lambda: not site.holders(), 20, what="b's permit reclaimed from its dead child")
    site.go("a")
    for wanted in (
        "celery_semaphore_reclaimed_total",
        "celery_semaphore_timeouts_total",
        "celery_semaphore_hold_seconds_bucket",
    ):
        wait_until(
            lambda name=wanted: name in _scraped(site),
            20,
            interval=0.2,
            what=f"{wanted} scraped",
        )
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    expressions = list(_expressions(dashboard))
    assert len(expressions) >= 8
    used = {m for e in expressions for m in METRIC.findall(e)}
    scraped = busy | _scraped(site)
    missing = sorted(used - scraped)
    assert not missing, f"the dashboard queries metrics the worker does not export: {missing}"
    # every panel's query names at least one metric, and every semaphore gauge is charted
    assert all(METRIC.search(e) for e in expressions if "label_values" not in e)
    assert {"celery_semaphore_in_use", "celery_semaphore_limit", "celery_semaphore_waiting"} <= used
    assert {"celery_semaphore_rate_started", "celery_semaphore_rate_limit"} <= used
    assert {
        "celery_semaphore_effective_limit",
        "celery_semaphore_paused_seconds",
        "celery_semaphore_throttles_total",
    } <= used


# -- a real browser ---------------------------------------------------------------------------


def _which(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def chromium_driver() -> Iterator[Any]:
    """Headless chromium through chromedriver; skipped (failed on CI) when they are missing."""
    problems = []
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        problems.append("selenium is not installed (pip install -e '.[dev]')")
    chromium, driver_path = _which(CHROMIUM), _which(CHROMEDRIVER)
    if chromium is None or driver_path is None:
        problems.append(
            "chromium and chromedriver are needed (Debian: apt-get install chromium "
            "chromium-driver)"
        )
    if problems:
        # skipped locally, a failure on CI (where .ci/run installs them); the README's
        # pip-only route does not promise a browser
        unavailable(
            "no browser for the web page tests: " + "; ".join(problems), beyond_the_route=True
        )
    options = Options()
    options.binary_location = str(chromium)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,900",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium_driver: Any) -> Any:
    """The browser on a blank page (a test's own typing and state do not carry over)."""
    chromium_driver.get("about:blank")
    return chromium_driver


def _until(driver: Any, predicate: Callable[[Any], Any], what: str, timeout: float = 10) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(predicate, message=what)


def _click(driver: Any, css: str, text: str | None = None, what: str = "a link") -> None:
    """Click the element ``css`` (with ``text``, if given), found again if the page re-renders
    it between the look-up and the click (its lists refresh every few seconds)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def click(d: Any) -> bool:
        found = [e for e in d.find_elements("css selector", css) if text is None or e.text == text]
        if not found:
            return False
        found[0].click()
        return True

    WebDriverWait(
        driver, 10, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(click, message=what)


def _texts(driver: Any, css: str) -> list[str]:
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return [e.text for e in driver.find_elements("css selector", css)]
    except StaleElementReferenceException:  # re-rendered meanwhile: look again
        return []


def _screenshot(driver: Any, name: str) -> None:
    where = os.environ.get("CELERY_SEMAPHORE_SCREENSHOTS")
    if where:
        folder = Path(where) if Path(where).is_absolute() else ROOT / where
        folder.mkdir(parents=True, exist_ok=True)
        # the whole page, not just the window
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, max(600, min(2000, int(height) + 20)))
        try:
            driver.save_screenshot(str(folder / f"web-{name}.png"))
        finally:
            driver.set_window_size(1400, 900)


def _no_alert(driver: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018 - raises when no alert is open


def test_browser_shows_a_markup_name_as_text(browser: Any, site: Site) -> None:
    browser.get(site.url + "/")
    _until(browser, lambda d: SCRIPT_NAME in _texts(d, "a.sem-link"), "the markup name as text")
    _no_alert(browser)
    assert browser.title == "celery-semaphore"  # the name's <script> did not run
    # no element came from the name: the page's own <script> tag is the only one, no <img>
    assert browser.execute_script("return document.scripts.length") == 1
    assert browser.execute_script("return document.images.length") == 0
    assert "Actions are on" in browser.find_element("id", "actions-note").text
    # its detail page, reached by the link
    _click(browser, "a.sem-link", SCRIPT_NAME, "the markup name's link")
    _until(browser, lambda d: SCRIPT_NAME in _texts(d, "#title code"), "the detail's title")
    _no_alert(browser)
    assert browser.title == "celery-semaphore"


def test_browser_shows_a_holder_come_and_go_and_a_waiters_place(
    browser: Any, site: Site, two_tasks: Any
) -> None:
    browser.get(site.url + "/#/s/web")
    _until(browser, lambda d: _texts(d, "#title code") == ["web"], "the detail page")
    assert _texts(browser, "tr.holder") == []
    a, b = two_tasks()
    _until(browser, lambda d: any(a in t for t in _texts(d, "tr.holder")), "a's holder row")
    _until(
        browser,
        lambda d: _texts(d, f'tr.waiter[data-task-id="{b}"] td.position') == ["0"],
        "b waiting at position 0",
    )
    # held by the worker's gate, and which node that is
    assert _texts(browser, f'tr.waiter[data-task-id="{b}"] td.how') == ["held by a worker"]
    assert _texts(browser, f'tr.waiter[data-task-id="{b}"] td.held-by') == [site.worker.name]
    _screenshot(browser, "detail")
    browser.get(site.url + "/#/")
    _until(
        browser,
        lambda d: _texts(d, 'tr.sem-row[data-name="web"] td.waiting') == ["1"],
        "the overview's line for 'web'",
    )
    _screenshot(browser, "overview")
    browser.get(site.url + "/#/s/web")
    _until(browser, lambda d: _texts(d, "tr.waiter"), "the detail page again")
    # explain b, from the link in its row: the CLI's text
    _click(browser, f'tr.waiter[data-task-id="{b}"] a.task-link', what="the waiter's link")
    _until(browser, lambda d: "place in line: 0" in " ".join(_texts(d, "pre.explain")), "why")
    assert a in " ".join(_texts(browser, "pre.explain"))  # holding now
    # why it waits, in one sentence first, above the facts
    [sentence] = _texts(browser, "p.sentence")
    assert sentence.startswith(f"task {b} (web.hold) waits for semaphore 'web' because the "), (
        sentence
    )
    _screenshot(browser, "explain")
    browser.back()
    _until(browser, lambda d: _texts(d, "#title code") == ["web"], "the detail page")
    site.go("a")  # a ends: b holds
    _until(
        browser,
        lambda d: any(b in t for t in _texts(d, "tr.holder")) and not _texts(d, "tr.waiter"),
        "b's holder row, no waiter",
    )
    assert not any(a in t for t in _texts(browser, "tr.holder"))
    site.go("b")
    _until(browser, lambda d: not _texts(d, "tr.holder"), "no holder left")
    # a task that is done, explained from the header's form
    browser.find_element("id", "explain-id").send_keys(a)
    browser.find_element("css selector", "#explain-form button").click()
    _until(browser, lambda d: "neither holding nor waiting" in " ".join(_texts(d, "pre")), "a")


def test_browser_action_refused_without_the_token(browser: Any, site: Site) -> None:
    browser.get(site.url + "/#/s/web")
    _until(browser, lambda d: d.find_elements("id", "set-limit"), "the actions")
    browser.find_element("id", "limit-input").send_keys("5")
    browser.find_element("id", "set-limit").click()
    _until(
        browser,
        lambda d: "refused (403)" in d.find_element("id", "message").text,
        "the refusal",
    )
    assert site.sem().inspect().limit_override is None
    _screenshot(browser, "refused")
    browser.find_element("id", "token").send_keys(TOKEN)
    browser.find_element("id", "set-limit").click()
    _until(browser, lambda d: "set-limit done" in d.find_element("id", "message").text, "done")
    assert site.sem().inspect().limit_override == 5
    browser.find_element("id", "clear-limit").click()
    wait_until(lambda: site.sem().inspect().limit_override is None, 10, what="override cleared")


def test_browser_read_only_page_says_so(browser: Any, site: Site) -> None:
    browser.get(site.worker_url + "/#/s/web")
    _until(browser, lambda d: _texts(d, "#title code") == ["web"], "the worker's page")
    assert "Read-only" in browser.find_element("id", "actions-note").text
    assert browser.find_elements("id", "set-limit") == []
    assert browser.find_elements("css selector", "button.release") == []


def test_browser_shows_rate_windows_and_a_waiter_held_by_the_rate(browser: Any, site: Site) -> None:
    # "2/h": the window stays full for the whole test (a 2/s window would open meanwhile)
    rated = Semaphore(
        "rated-page", 3, rate="2/h", redis=site.env.redis_url, key_prefix=site.env.prefix
    )
    # found by SCAN only, so its limit is unknown until an override says it (no free units
    # are known without a limit, and nobody is then said to be held by the rate)
    rated.set_limit_override(3)
    owner = {"task_id": "rate-held", "task": "web.hold", "host": "script"}
    permits = [rated.acquire(blocking=False) for _ in range(2)]
    assert all(permits)
    assert rated.try_acquire("rate-held:0", owner=owner, place_ttl=120).rate_retry_after
    try:
        browser.get(site.url + "/#/s/rated-page")
        _until(browser, lambda d: _texts(d, "tr.rate td.started") == ["2"], "the rate window")
        assert _texts(browser, 'tr.rate[data-rate="2/h"] td.available') == ["0"]
        [why] = _texts(browser, "tr.waiter td.why")
        assert why.startswith("held by the rate 2/h: the window opens in "), why
        browser.get(site.url + "/#/")
        _until(
            browser,
            lambda d: _texts(d, 'tr.rate[data-rate="2/h"] td.rate-text') != [],
            "the overview's rate row",
        )
        [text] = _texts(browser, 'tr.rate[data-rate="2/h"] td.rate-text')
        assert text.startswith("2 started, 0 available, opens in ")
    finally:
        rated.withdraw("rate-held:0")
        for permit in permits:
            assert permit is not None
            permit.release()
        rated.set_limit_override(None)


def test_browser_shows_the_effective_limit_and_a_waiter_held_by_a_pause(
    browser: Any, site: Site
) -> None:
    adaptive = Semaphore(
        "throttled-page", 10, adaptive=True, redis=site.env.redis_url, key_prefix=site.env.prefix
    )
    adaptive.set_limit_override(10)  # found by SCAN only: the override makes its limit known
    owner = {"task_id": "pause-held", "task": "web.hold", "host": "script"}
    permits = [adaptive.acquire(blocking=False) for _ in range(4)]
    assert all(permits)
    assert permits[0] is not None
    # halves the limit to 5 and pauses every start for an hour: the test never outlives it
    result = permits[0].throttled(retry_after=3600)
    assert (result.decreased, result.effective_limit) == (True, 5)
    assert adaptive.try_acquire("pause-held:0", owner=owner, place_ttl=120).position == 0
    try:
        browser.get(site.url + "/#/s/throttled-page")
        _until(browser, lambda d: _texts(d, "tr.waiter td.why") != [], "the waiter")
        [why] = _texts(browser, "tr.waiter td.why")
        assert why.startswith("held by a throttle pause: it ends in "), why

        def facts(driver: Any) -> dict[str, str] | None:
            keys, values = _texts(driver, "dl dt"), _texts(driver, "dl dd")
            if len(keys) != len(values) or "Effective limit" not in keys:
                return None  # re-rendered between the two reads: look again
            return dict(zip(keys, values, strict=True))

        shown = _until(browser, facts, "the semaphore's facts")
        assert shown["Effective limit"].startswith("effective limit 5 of 10: lowered after 1 ")
        assert shown["Effective limit"].endswith(" more")  # "; paused 59m59s more"
        assert shown["Throttles"].startswith("1 (the last ")
        browser.get(site.url + "/#/")
        _until(
            browser,
            lambda d: _texts(d, "tr.effective td.effective-text") != [],
            "the overview's effective-limit row",
        )
        [text] = _texts(browser, "tr.effective td.effective-text")
        assert text.startswith("effective limit 5 of 10: lowered after 1 throttle(s)"), text
    finally:
        adaptive.withdraw("pause-held:0")
        for permit in permits:
            assert permit is not None
            permit.release()
        adaptive.set_limit_override(None)


def test_browser_groups_the_waiters_by_queue_and_says_why_each_waits(
    browser: Any, site: Site
) -> None:
    shared = Semaphore("queues-page", 3, redis=site.env.redis_url, key_prefix=site.env.prefix)
    shared.set_limit_override(3)  # found by SCAN only: the override makes its limit known

    def attempt(task_id: str, queue: str) -> Any:
        owner = {"task_id": task_id, "task": "web.hold", "host": "script"}
        cap = 2 if queue == "bulk" else None
        return shared.try_acquire(
            f"{task_id}:0", owner=owner, place_ttl=120, partition=queue, partition_cap=cap
        )

    permits = [attempt(t, q).permit for t, q in [("qb1", "bulk"), ("qb2", "bulk"), ("qi1", "i")]]
    assert all(permits)
    waiting = [("qb3", "bulk"), ("qi2", "i"), ("qb4", "bulk"), ("qi3", "i")]  # interleaved
    assert [attempt(t, q).position for t, q in waiting] == [0, 0, 1, 1]
    try:
        browser.get(site.url + "/#/s/queues-page")
        _until(browser, lambda d: len(_texts(d, "tr.waiter")) == 4, "the four waiters")
        rows = browser.find_elements("css selector", "table.waiters tbody tr")
        order = [r.get_attribute("data-task-id") or r.text for r in rows]
        assert order == [
            "Queue bulk: 2 in use of its cap 2, 2 waiting",
            "qb3",
            "qb4",
            "Queue i: 1 in use (no cap), 2 waiting",
            "qi2",
            "qi3",
        ]
        assert _texts(browser, "tr.waiter td.position") == ["0", "1", "0", "1"]
        whys = _texts(browser, "tr.waiter td.why")
        assert whys[0] == "queue bulk at its cap: 2 of 2 unit(s) in use"
        assert whys[2] == "semaphore full: 3 of 3 unit(s) in use, 0 free"
        assert browser.find_elements("css selector", "span.bar.unknown") == []
    finally:
        for task_id, _ in waiting:
            shared.withdraw(f"{task_id}:0")
        for permit in permits:
            assert permit is not None
            permit.release()
        shared.set_limit_override(None)
