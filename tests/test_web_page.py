"""The chat page at / in headless Chromium (Debian's chromium + chromium-driver, driven by
selenium): it loads, a message is sent, the answer streams in, and the status line shows tokens/s
and the realised residual rate. `.ci/run` installs the browser; without it the test is skipped.

Oracle: the reply the Python API gives to the same message and seed. The model has no
end-of-generation token here, so the reply runs to the tokens the page asks for: with one, the tiny
random model ends its first reply at once in about 2% of draws and the page rightly shows nothing."""

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


MESSAGE, MAX_TOKENS, SEED = "hello experts", 24, 7


def test_web_page_streams_an_answer(gguf):  # noqa: F811
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    m = rm.Model(gguf, n_ctx=256, n_threads=2)
    m.tokenizer.eog_ids = frozenset()
    with running(m, parallel=1, queue=4) as (url, _):
        browser = webdriver.Chrome(service=Service(DRIVER), options=opts)
        try:
            browser.get(url + "/")
            wait = WebDriverWait(browser, 60)
            wait.until(lambda b: b.find_element(By.ID, "model").text != "")
            browser.find_element(By.ID, "max").clear()
            browser.find_element(By.ID, "max").send_keys(str(MAX_TOKENS))
            browser.find_element(By.ID, "seed").send_keys(str(SEED))
            browser.find_element(By.ID, "input").send_keys(MESSAGE)
            browser.find_element(By.ID, "send").click()
            wait.until(lambda b: "tok/s" in b.find_element(By.ID, "status").text)
            answers = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")
            assert answers
            shown = answers[-1].get_attribute("textContent")
            status = browser.find_element(By.ID, "status").text
        finally:
            browser.quit()
    with rm.Model(gguf, n_ctx=256, n_threads=2) as ref:
        ref.tokenizer.eog_ids = frozenset()
        want = ref.create_chat_completion([{"role": "user", "content": MESSAGE}], max_tokens=MAX_TOKENS, seed=SEED)
    assert want["usage"]["completion_tokens"] == MAX_TOKENS
    assert shown == want["choices"][0]["message"]["content"] and shown.strip() != ""
    assert status.startswith(f"{MAX_TOKENS} tokens, ") and "residual rate" in status
