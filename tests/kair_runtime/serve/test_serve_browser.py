"""The demo page in headless Chromium: type a question, watch steps stream in, get the answer.

Needs Debian's `chromium` and `chromium-driver` (/usr/bin/chromium, /usr/bin/chromedriver) and
the `selenium` pip package; skips with the reason when any is missing. Set KAIR_SCREENSHOT_DIR to
keep the screenshot somewhere other than pytest's tmp dir.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from serve_helpers import serve_config
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair
from lexical import WordOverlap

QUESTION = "Which city was the band behind Wonderwall formed in?"
CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
if not CHROMIUM.exists() or not DRIVER.exists():
    pytest.skip("headless browser test needs Debian's chromium and chromium-driver "
                "(apt-get install -y chromium chromium-driver)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs `pip install selenium`")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from kair_runtime.serve.app import create_app  # noqa: E402
from kair_runtime.serve.thread import BackgroundServer  # noqa: E402


class SlowEcho(ScriptedLLM):
    """echo_kair with a fixed delay per generate() call, so the steps visibly arrive one by one."""

    def __init__(self, delay_s: float):
        super().__init__(echo_kair, name="scripted-slow")
        self.delay_s = delay_s

    def generate(self, prompts, sampling):
        time.sleep(self.delay_s)
        return super().generate(prompts, sampling)


@pytest.fixture
def browser(tmp_path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1400"):
        opts.add_argument(flag)
    # An explicit driver path: selenium must not try to download one.
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=str(DRIVER)))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_page_streams_steps_draws_the_index_and_highlights_the_answer(browser, tmp_path):
    llm = SlowEcho(delay_s=0.5)
    app = create_app(serve_config({"max_steps": 3, "top_k": 3}), build=lambda: (llm, WordOverlap()))
    with BackgroundServer(app) as server:
        server.wait_ready(30)
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 30, poll_frequency=0.05)
        wait.until(lambda d: d.find_element(By.ID, "health").text == "ready")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#format option"))  # /v1/info loaded
        box = browser.find_element(By.ID, "question")
        box.send_keys(QUESTION)
        browser.find_element(By.ID, "go").click()

        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#steps .step"))
        # The first step is on screen while the server is still working: it streamed.
        assert not browser.find_element(By.ID, "answer").is_displayed()
        wait.until(lambda d: d.find_element(By.ID, "answer").is_displayed())
        time.sleep(2.2)  # let the graph layout settle (~110 animation frames) before the screenshot

        answer = browser.find_element(By.ID, "answer-text").text
        steps = browser.find_elements(By.CSS_SELECTOR, "#steps .step")
        nodes = browser.find_elements(By.CSS_SELECTOR, "#graph circle:not(.ring)")
        labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#graph text.nlabel")]
        queries = browser.find_elements(By.CSS_SELECTOR, "#steps .step .query")
        api_answer = httpx.post(server.url + "/v1/answer", json={"question": QUESTION}, timeout=30).json()["answer"]
        shot = tmp_path / "kair-serve-page.png"
        assert browser.save_screenshot(str(shot))
        if os.environ.get("KAIR_SCREENSHOT_DIR"):
            shutil.copy(shot, Path(os.environ["KAIR_SCREENSHOT_DIR"]) / shot.name)

    assert answer and answer == api_answer  # the page shows what the API answers
    assert 1 <= len(steps) <= 3 and queries
    assert answer in labels and len(nodes) >= 2  # echo_kair's keywords are the retrieved titles
    assert browser.find_elements(By.CSS_SELECTOR, "#graph circle.gold")  # the answer's node
    assert shot.stat().st_size > 10_000
    assert not browser.find_element(By.ID, "error").is_displayed()


def test_page_works_with_an_api_key(browser):
    """With --api-key, /healthz tells the page only the state word; that is all the page reads
    from it, and the key typed into the page unlocks /v1/info and the answer stream."""
    app = create_app(serve_config({"max_steps": 2, "top_k": 3}), api_key="s3cret",
                     build=lambda: (ScriptedLLM(echo_kair), WordOverlap()))
    with BackgroundServer(app) as server:
        server.wait_ready(30)
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 30, poll_frequency=0.05)
        wait.until(lambda d: d.find_element(By.ID, "health").text == "ready")
        wait.until(lambda d: d.find_element(By.ID, "model").text == "API key needed")
        key = browser.find_element(By.ID, "key")
        key.send_keys("s3cret")
        browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", key)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#format option"))  # /v1/info with the key
        browser.find_element(By.ID, "question").send_keys(QUESTION)
        browser.find_element(By.ID, "go").click()
        wait.until(lambda d: d.find_element(By.ID, "answer").is_displayed())
        assert browser.find_element(By.ID, "answer-text").text
        assert not browser.find_element(By.ID, "error").is_displayed()
