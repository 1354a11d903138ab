"""The chat page at / in headless Chromium (Debian's chromium + chromium-driver, driven by
selenium): it loads, a message is sent, the answer streams in, and the status line shows tokens/s
and the realised residual rate. `.ci/run` installs the browser; without it the test is skipped."""

from __future__ import annotations

import shutil

import pytest

import rapidmoe_gguf as rm
from test_server import gguf, running  # noqa: F401  (gguf is a fixture)

webdriver = pytest.importorskip("selenium.webdriver")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="chromium and chromedriver are not installed")]


def test_web_page_streams_an_answer(gguf):  # noqa: F811
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    with running(rm.Model(gguf, n_ctx=256, n_threads=2), parallel=1, queue=4) as (url, _):
        browser = webdriver.Chrome(service=Service(DRIVER), options=opts)
        try:
            browser.get(url + "/")
            wait = WebDriverWait(browser, 60)
            wait.until(lambda b: b.find_element(By.ID, "model").text != "")
            browser.find_element(By.ID, "max").clear()
            browser.find_element(By.ID, "max").send_keys("24")
            browser.find_element(By.ID, "input").send_keys("hello experts")
            browser.find_element(By.ID, "send").click()
            wait.until(lambda b: "tok/s" in b.find_element(By.ID, "status").text)
            answers = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")
            assert answers and answers[-1].text.strip() != ""
            assert "residual rate" in browser.find_element(By.ID, "status").text
        finally:
            browser.quit()
