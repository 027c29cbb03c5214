"""The web console in a real headless Chromium, against `inferplane up` on the simulator.

One fleet for the module (two L40S cards: two chat replicas, one embedding model sharing
card 1), auth on with an admin token and one API key. Debian's `chromium` and
`chromium-driver` drive it through Selenium with both paths given, so nothing is ever
downloaded; without them the module is skipped with the package names to install.
Screenshots go to $INFERPLANE_TEST_ARTIFACTS (default: a tmp directory).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from console_fleet import console_fleet

from inferplane.console.auth import COOKIE

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ADMIN_TOKEN = "console-test-admin-token"
T = TypeVar("T")

if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(
        f"chromium is not installed ({CHROMIUM}, {CHROMEDRIVER}): "
        "apt-get install -y chromium chromium-driver",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (dev extra)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402

# "embedding" in the name: the simulator takes the task from the checkpoint and its
# name, not from the fleet's `task:` (reported to the lead)
FLEET = console_fleet("embedding", embed_keys="    task: embed\n", extra="""\
gateway:
  auth: "on"
""")


@dataclass
class Fleet:
    url: str
    state_dir: Path
    api_key: str
    artifacts: Path

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "state.json").read_text())
        return data

    def plan(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "plan.json").read_text())
        return data


def _cli(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> None:
    done = subprocess.run([sys.executable, "-m", "inferplane", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("console-fleet")
    (root / "fleet.yaml").write_text(FLEET)
    state = root / "state"
    env = {**os.environ, "INFERPLANE_ADMIN_TOKEN": ADMIN_TOKEN}
    _cli("up", "fleet.yaml", "--detach", "--state-dir", str(state), "--gateway-port", "0",
         "--ready-timeout-s", "90", cwd=root, env=env)  # fmt: skip
    try:
        url = json.loads((state / "state.json").read_text())["gateway"]["url"]
        created = httpx.post(url + "/admin/keys", json={"name": "console-test"},
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
        assert created.status_code == 201, created.text
        where = os.environ.get("INFERPLANE_TEST_ARTIFACTS")
        artifacts = Path(where) if where else tmp_path_factory.mktemp("console-artifacts")
        artifacts.mkdir(parents=True, exist_ok=True)
        yield Fleet(url, state, created.json()["key"], artifacts)
    finally:
        _cli("down", "--state-dir", str(state), cwd=root, env=env)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)  # fmt: skip
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def signed_in(browser: WebDriver, fleet: Fleet) -> WebDriver:
    """The browser holding the console's session cookie: the first test signs in, but a test
    picked alone (-k) must not depend on it (it would wait on the login page instead)."""
    if not (browser.current_url.startswith(fleet.url) and browser.get_cookie(COOKIE)):
        sign_in(browser, fleet)
    return browser


def until(check: Callable[[], T | None], timeout_s: float = 20, what: str = "") -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


def shot(driver: WebDriver, fleet: Fleet, name: str) -> None:
    """A screenshot of the whole page (the window grown to the page's height)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1400, min(max(height + 40, 700), 2400))
    driver.save_screenshot(str(fleet.artifacts / f"console-{name}.png"))
    driver.set_window_size(1400, 1000)


def sign_in(driver: WebDriver, fleet: Fleet) -> None:
    driver.get(fleet.url + "/ui/login")
    driver.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    until(lambda: driver.find_elements(By.CSS_SELECTOR, "body[data-page=fleet]"),
          what="the fleet page after signing in")


# ---- the tests, in the order a person would use the console -----------------------------


def test_console_refuses_without_the_admin_token(browser: WebDriver, fleet: Fleet) -> None:
    api = httpx.get(fleet.url + "/ui/api/fleet", timeout=10)
    assert api.status_code == 401 and api.json()["error"]["code"] == 401
    assert "chat-0" not in api.text and "L40S" not in api.text
    page = httpx.get(fleet.url + "/ui/fleet", timeout=10)
    assert page.status_code == 401 and 'id="login"' in page.text and "chat-0" not in page.text
    key = {"Authorization": f"Bearer {fleet.api_key}"}  # an API key is not the admin token
    assert httpx.get(fleet.url + "/ui/api/fleet", headers=key, timeout=10).status_code == 401
    restart = httpx.post(fleet.url + "/ui/api/instances/chat-0/restart",
                         headers={**key, "x-inferplane-console": "1"}, timeout=10)
    assert restart.status_code == 401 and fleet.status()["instances"][0]["restarts"] == 0

    browser.get(fleet.url + "/ui/fleet")
    assert browser.find_elements(By.ID, "login") and not browser.find_elements(By.CLASS_NAME, "gpu")
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    # a click does not wait for the page it submits to: wait for the answer
    error = until(lambda: browser.find_elements(By.CSS_SELECTOR, ".login .error"),
                  what="the sign-in error")  # fmt: skip
    assert "wrong admin token" in error[0].text
    shot(browser, fleet, "login")
    sign_in(browser, fleet)


# htmx swaps the fleet map every 2 s: read it in one script, never element by element.
FLEET_DOM = """
return [...document.querySelectorAll('.node .gpu')].map((g) => ({
  node: g.closest('.node').dataset.node, index: +g.dataset.gpuIndex,
  memory: +g.dataset.memoryGib, used: +g.dataset.usedGib, free: +g.dataset.freeGib,
  rows: [...g.querySelectorAll('tr.instance')].map((r) => ({
    name: r.dataset.instance, state: r.dataset.state, share: +r.dataset.shareGib,
    live: !!r.querySelector('.kvlive') })),
  segs: [...g.querySelectorAll('.bar .seg')].map((s) => ({
    name: s.dataset.instance || null, kind: s.dataset.kind, gib: +s.dataset.gib })),
}));
"""


@pytest.mark.usefixtures("signed_in")
def test_fleet_map_shows_every_instance_on_its_gpu_with_the_plans_bars(
    browser: WebDriver, fleet: Fleet
) -> None:
    plan = fleet.plan()
    browser.get(fleet.url + "/ui/fleet")

    def live_map() -> list[dict[str, Any]] | None:
        cards: list[dict[str, Any]] = browser.execute_script(FLEET_DOM)
        rows = [r for c in cards for r in c["rows"]]
        # the engines' live KV figures arrive with the sampler's first reading
        return cards if rows and all(r["live"] for r in rows) else None

    cards = until(live_map, what="live engine numbers for every instance")
    by_card = {(c["node"], c["index"]): c for c in cards}
    assert len(by_card) == len(plan["gpus"])
    for gpu in plan["gpus"]:
        card = by_card[(gpu["node"], gpu["index"])]
        assert card["memory"] == pytest.approx(gpu["memory_gib"])
        assert sorted(r["name"] for r in card["rows"]) == sorted(gpu["instances"])
        assert all(r["state"] == "ready" for r in card["rows"])
        for row in card["rows"]:  # weights + KV pool + overhead = the instance's share
            parts = [s for s in card["segs"] if s["name"] == row["name"]]
            assert sorted(s["kind"] for s in parts) == ["kv_cache", "overhead", "weights"]
            assert sum(s["gib"] for s in parts) == pytest.approx(row["share"], abs=0.002)
        used = sum(s["gib"] for s in card["segs"] if s["kind"] != "free")
        free = [s["gib"] for s in card["segs"] if s["kind"] == "free"]
        assert used == pytest.approx(gpu["used_gib"], abs=0.02)
        assert free == [pytest.approx(gpu["free_gib"])]
        assert used + free[0] == pytest.approx(gpu["memory_gib"], abs=0.03)
    for inst in plan["instances"]:  # each instance sits on exactly its planned cards
        on = sorted(c["index"] for c in cards if inst["id"] in {r["name"] for r in c["rows"]})
        assert on == sorted(inst["gpu_indices"])
    shot(browser, fleet, "fleet")


@pytest.mark.usefixtures("signed_in")
def test_playground_streams_an_answer_and_names_the_replica(
    browser: WebDriver, fleet: Fleet
) -> None:
    browser.get(fleet.url + "/ui/playground")
    browser.find_element(By.ID, "pg-key").send_keys(fleet.api_key)
    browser.find_element(By.ID, "pg-max").clear()
    browser.find_element(By.ID, "pg-max").send_keys("64")
    browser.find_element(By.ID, "pg-send").click()
    read = "const o = document.getElementById('pg-output'); return [o.dataset.done, o.textContent]"
    # Streamed: some text is on the page while the answer is still coming.
    partial = until(lambda: (lambda d: d if d[0] == "false" and d[1] else None)(
        browser.execute_script(read)), 15, "part of the answer before the end")  # fmt: skip
    done = until(lambda: (lambda d: d if d[0] == "true" else None)(browser.execute_script(read)),
                 30, "the end of the stream")  # fmt: skip
    assert len(done[1]) > len(partial[1]) and "[error]" not in done[1]
    instance = browser.find_element(By.ID, "pg-instance").text
    assert instance in ("chat-0", "chat-1")
    assert browser.find_element(By.ID, "pg-replica").text.startswith("http://127.0.0.1:")
    assert browser.find_element(By.ID, "pg-ttft").text.endswith(" ms")
    assert int(browser.find_element(By.ID, "pg-tokens").text) > 1
    shot(browser, fleet, "playground")
    # an embedding request to the embedding model, routed to its one replica
    Select(browser.find_element(By.ID, "pg-model")).select_by_value("embedding")
    Select(browser.find_element(By.ID, "pg-kind")).select_by_value("embeddings")
    browser.find_element(By.ID, "pg-send").click()
    answer = until(lambda: (lambda d: d if d[0] == "true" and d[1] else None)(
        browser.execute_script(read)), 15, "the embedding")  # fmt: skip
    assert "dimensions" in answer[1], answer
    assert browser.find_element(By.ID, "pg-instance").text == "embedding-0"


def _load(fleet: Fleet, stop: threading.Event, workers: int = 4) -> list[threading.Thread]:
    def loop() -> None:
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {fleet.api_key}"}) as c:
            while not stop.is_set():
                c.post(fleet.url + "/v1/chat/completions", json={
                    "model": "chat", "max_tokens": 48, "stream": True,
                    "messages": [{"role": "user", "content": "tell me about GPUs " * 20}],
                })  # fmt: skip

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.usefixtures("signed_in")
def test_charts_update_while_load_runs(browser: WebDriver, fleet: Fleet) -> None:
    browser.get(fleet.url + "/ui/charts")
    charts = "#charts .chart[data-chart='{}']"

    def chart(title: str) -> tuple[int, dict[str, Any]] | None:
        found = browser.find_elements(By.CSS_SELECTOR, charts.format(title))
        if not found:
            return None
        return int(found[0].get_attribute("data-points") or 0), json.loads(
            found[0].get_attribute("data-last") or "{}"
        )

    until(lambda: chart("requests/s"), what="the charts")
    stop = threading.Event()
    threads = _load(fleet, stop)
    try:
        first = until(lambda: (lambda c: c if c and (c[1].get("gateway") or 0) > 0 else None)(
            chart("requests/s")), 20, "requests/s above zero")  # fmt: skip
        later = until(lambda: (lambda c: c if c and c[0] > first[0] + 1 else None)(
            chart("requests/s")), 10, "new points")  # fmt: skip
        assert later[0] > first[0]
        kv = until(lambda: (lambda c: c if c and any((v or 0) > 0 for v in c[1].values())
                            else None)(chart("KV-cache usage")), 10, "KV usage under load")
        assert set(kv[1]) <= {"chat-0", "chat-1"}
        # tokens are counted as requests finish: some seconds have none
        until(lambda: (lambda c: c and (c[1].get("gateway (prompt+completion)") or 0) > 0)(
            chart("tokens/s")), 10, "tokens/s above zero")  # fmt: skip
        shot(browser, fleet, "charts")
    finally:
        stop.set()
        for t in threads:
            t.join(30)


# Arms a click on a replica's logs button in the task right after htmx swaps a fresh
# #models table in: the earliest a person or Selenium can click the new row.
CLICK_AFTER_SWAP = """
const [name, done] = arguments;
document.addEventListener('htmx:afterSwap', function once(ev) {
  if (ev.target.id !== 'models') return;
  document.removeEventListener('htmx:afterSwap', once);
  setTimeout(() => {
    document.querySelector(`tr.replica[data-instance='${name}'] button.link`).click();
    done(true);
  }, 0);
});
"""


@pytest.mark.usefixtures("signed_in")
def test_a_click_right_after_a_refresh_opens_the_logs(browser: WebDriver, fleet: Fleet) -> None:
    browser.get(fleet.url + "/ui/models")
    # Before the settle delay was 0, htmx wired a swapped-in row 20 ms late and a click
    # in that window sent no request: every one of these was lost.
    for name in ("chat-1", "embedding-0", "chat-0"):
        browser.execute_async_script(CLICK_AFTER_SWAP, name)
        panel = f"#logs .logs[data-instance='{name}']"
        found = functools.partial(browser.find_elements, By.CSS_SELECTOR, panel)
        until(found, what=f"{name}'s logs")


@pytest.mark.usefixtures("signed_in")
def test_killed_engine_shows_restarting_then_ready(browser: WebDriver, fleet: Fleet) -> None:
    browser.get(fleet.url + "/ui/models")
    row = "tr.replica[data-instance='chat-0']"  # swapped by htmx every 1 s: read by script

    def state() -> tuple[str, str]:
        got: list[str] = browser.execute_script(
            f'const r = document.querySelector("{row}");'
            "return r ? [r.dataset.state, r.dataset.restarts] : ['', '']"
        )
        return got[0], got[1]

    until(lambda: state()[0] == "ready", what="chat-0 ready")
    [rec] = [i for i in fleet.status()["instances"] if i["name"] == "chat-0"]
    os.kill(rec["pid"], signal.SIGKILL)
    # The table refreshes every second; a simulated engine is back within a few.
    seen: set[str] = set()

    def back() -> bool:
        now = state()
        seen.add(now[0])
        return now == ("ready", str(rec["restarts"] + 1))

    until(back, 45, "chat-0 ready again after one restart")
    browser.execute_script(f'document.querySelector("{row} button.link").click()')
    panel = "#logs .logs[data-instance='chat-0']"
    logs = until(lambda: browser.find_elements(By.CSS_SELECTOR, panel), what="the log panel")
    text = logs[0].text
    # the sampler's state changes (every second) list the restart too
    left = seen & {"restarting", "loading", "unhealthy"}
    assert left or "→ restarting" in text or "→ starting" in text, (seen, text)
    assert "--- starting" in text and "→ ready" in text and "restarting" in text
    shot(browser, fleet, "models")


@pytest.mark.usefixtures("signed_in")
def test_usage_page_shows_the_keys_tokens(browser: WebDriver, fleet: Fleet) -> None:
    browser.get(fleet.url + "/ui/usage")
    read = """const t = document.querySelector('table.usage[data-by=key]');
    return t ? [t.textContent, [...t.querySelectorAll('tr[data-total-tokens]')]
                .map((r) => +r.dataset.totalTokens)] : null"""
    text, tokens = until(lambda: browser.execute_script(read), what="the per-key table")
    assert "console-test" in text and tokens and max(tokens) > 0
    shot(browser, fleet, "usage")


def test_artifacts_are_written(fleet: Fleet) -> None:
    names = {p.name for p in fleet.artifacts.glob("console-*.png")}
    assert {"console-login.png", "console-fleet.png", "console-playground.png"} <= names
    for path in fleet.artifacts.glob("console-*.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
