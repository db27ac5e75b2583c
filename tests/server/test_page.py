"""The served page in a real headless Chromium: it loads, speaks with the tiny model, its audio
element receives the streamed audio, the duration shown is each request's own, a failure
shows its error and clears the old result, and a keyed server's page asks for the key as it
loads and drops the old error once the key works (test_page_models.py: several models). Needs Debian's chromium + chromium-driver (installed
by .ci/run); without them the test is skipped with that reason."""

import shutil
import time

import numpy as np
import pytest

from moss_tts.errors import InputError
from moss_tts.models.nano_tts import NanoTTS
from moss_tts.sampling import SamplingOptions
from moss_tts.server import create_app
from moss_tts.models.tts import CodecTTS
from moss_tts.voices import add_voice
from tests.server.helpers import Served, settings, tiny_model_files

# Browsers decode WAV only from 3 kHz up: the tiny codec is declared at 16 kHz here (its
# windows scale with the rate; the towers are unchanged).
RATE = 16000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("web")
    model, codec = tiny_model_files(d, rate=RATE)
    tts = NanoTTS.load(model, codec=codec, threads=1)
    s = Served(create_app(tts, settings(d / "voices")))
    yield s
    s.stop()
    tts.close()


CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                   reason="chromium and chromedriver are not installed")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--autoplay-policy=no-user-gesture-required"):
        opts.add_argument(flag)
    b = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield b
    b.quit()


def speak(browser, text, seed="5"):
    """Type, press Speak, wait until the page is done; its status line."""
    from selenium.webdriver.common.by import By

    browser.find_element(By.ID, "text").clear()
    if text:
        browser.find_element(By.ID, "text").send_keys(text)
    browser.find_element(By.ID, "seed").clear()
    browser.find_element(By.ID, "seed").send_keys(seed)
    browser.find_element(By.ID, "speak").click()
    deadline = time.time() + 60
    while time.time() < deadline:
        if browser.find_element(By.ID, "speak").is_enabled() and \
                browser.find_element(By.ID, "status").text != "generating…":
            return browser.find_element(By.ID, "status").text
        time.sleep(0.1)
    raise AssertionError("the page did not finish")


def wait_for(browser, script, want, seconds=60):
    """Polls `script` in the page until it returns `want` (the page's own requests run on)."""
    deadline = time.time() + seconds
    while (got := browser.execute_script(script)) != want and time.time() < deadline:
        time.sleep(0.1)
    assert got == want, f"{script}: {got!r}, expected {want!r}"


def open_page(browser, url, loads=1):
    """Loads the page and waits until it has read the model and voice lists `loads` times."""
    browser.get(url + "/")
    wait_for(browser, f"return window.loads >= {loads}", True)


def pick_model(browser, name):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, "model")).select_by_value(name)


def enter_key(browser, key):
    """Types the key into its field (shown once the server answered 401) and leaves the field,
    which makes the page read its lists again."""
    from selenium.webdriver.common.by import By

    loads = browser.execute_script("return window.loads")
    wait_for(browser, "return document.getElementById('key-row').hidden", False, 10)
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "seed").click()      # the key field's change event
    wait_for(browser, f"return window.loads > {loads}", True)


VOICES = "return [...document.getElementById('voice').options].map(o => o.value)"
STATUS = "return document.getElementById('status').textContent"
KEY_HINT = "return document.getElementById('key-hint').textContent"


def player_duration(browser):
    return browser.execute_script(
        "const p = document.getElementById('player'); return new Promise(r => "
        "p.readyState >= 1 ? r(p.duration) "
        ": p.addEventListener('loadedmetadata', () => r(p.duration)))")


def shown_result(browser):
    """(player src, download hidden?)."""
    from selenium.webdriver.common.by import By

    src = browser.execute_script("return document.getElementById('player').getAttribute('src')")
    return src, browser.find_element(By.ID, "download").get_attribute("hidden") is not None


@needs_browser
def test_page_speaks_and_the_audio_element_receives_data(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    assert browser.title == "moss-tts"
    first = speak(browser, "Hello there.")
    src, hidden = shown_result(browser)
    assert src and src.startswith("blob:"), first
    received = browser.execute_script("return window.receivedBytes")
    duration = player_duration(browser)
    assert received > 0 and duration > 0 and not hidden
    assert browser.find_element(By.ID, "download").get_attribute("href") == src
    # the shown duration is this request's, not a running total over requests
    assert float(first.split()[0]) == pytest.approx(received / (2 * 2 * RATE), abs=0.01)
    assert speak(browser, "Hello there.") == first
    assert abs(player_duration(browser) - float(first.split()[0])) < 0.05


@needs_browser
def test_a_refused_request_shows_its_error_and_clears_the_old_result(server, browser):
    browser.get(server.url + "/")
    speak(browser, "Hello there.")
    assert shown_result(browser)[0].startswith("blob:")
    status = speak(browser, "")          # empty input: the server answers 400
    assert status.startswith("error:") and "input" in status
    assert shown_result(browser) == (None, True)


class FailingTTS:
    """Two chunks of audio, then a failure: the raw stream is cut mid-body."""

    sample_rate, channels, OPTIONS, FAMILY = RATE, 2, SamplingOptions, "nano"
    model = "stub"      # open, for the family contract's methods below
    WHOLE, whole_keywords, _need_open = CodecTTS.WHOLE, CodecTTS.whole_keywords, \
        CodecTTS._need_open
    BATCHED, LIVE = CodecTTS.BATCHED, CodecTTS.LIVE

    def stream(self, text, **kwargs):
        for _ in range(2):
            yield np.full((RATE // 10, 2), 0.1, np.float32)
        if text.startswith("fail"):
            raise InputError("generation failed")


@needs_browser
def test_a_stream_that_fails_midway_shows_an_error_and_clears_the_old_result(tmp_path, browser):
    s = Served(create_app(FailingTTS(), settings(tmp_path)))
    try:
        browser.get(s.url + "/")
        assert speak(browser, "fine").endswith(" s")
        assert shown_result(browser)[0].startswith("blob:")
        status = speak(browser, "fail now")
        assert status.startswith("error:")
        assert shown_result(browser) == (None, True)
    finally:
        s.stop()


@needs_browser
def test_the_page_works_with_an_api_key(tmp_path, browser):
    from selenium.webdriver.common.by import By

    add_voice("amy", np.zeros((2, 4), np.int32), {}, root=tmp_path / "voices")
    s = Served(create_app(FailingTTS(), settings(tmp_path / "voices", api_key="sk-page")))
    voices = "return [...document.getElementById('voice').options].map(o => o.value)"
    try:
        browser.get(s.url + "/")                       # the page itself needs no key
        assert speak(browser, "fine").startswith("error:")   # 401 without the key
        assert browser.execute_script(voices) == [""]
        browser.find_element(By.ID, "key").send_keys("sk-page")
        assert speak(browser, "fine").endswith(" s")
        deadline = time.time() + 10   # the list reloads when the key field changes
        while browser.execute_script(voices) != ["", "amy"] and time.time() < deadline:
            time.sleep(0.1)
        assert browser.execute_script(voices) == ["", "amy"]
    finally:
        s.stop()


@needs_browser
def test_the_page_says_up_front_that_the_server_needs_a_key(tmp_path, browser):
    """Issue 23, hole 9c: the key field and a hint show as the page loads, before any Speak;
    a server without a key shows no key field."""
    from selenium.webdriver.common.by import By

    keyed = Served(create_app(FailingTTS(), settings(tmp_path, api_key="sk-page")))
    open_server = Served(create_app(FailingTTS(), settings(tmp_path)))
    try:
        open_page(browser, keyed.url)
        assert browser.find_element(By.ID, "key").is_displayed()
        assert browser.execute_script(KEY_HINT) == "this server needs an API key"
        assert browser.execute_script(STATUS) == ""          # nothing was spoken yet
        open_page(browser, open_server.url)
        assert not browser.find_element(By.ID, "key").is_displayed()
    finally:
        keyed.stop()
        open_server.stop()


@needs_browser
def test_the_old_error_clears_once_the_right_key_is_entered(tmp_path, browser):
    """Issue 23, hole 9c: the 401 of a Speak without the key stayed on screen after the right
    key was entered; a wrong key says so."""
    s = Served(create_app(FailingTTS(), settings(tmp_path, api_key="sk-page")))
    try:
        open_page(browser, s.url)
        assert speak(browser, "fine").startswith("error: missing or wrong API key")
        enter_key(browser, "sk-wrong")
        assert browser.execute_script(KEY_HINT) == "the API key was refused: check it"
        assert browser.execute_script(STATUS).startswith("error: missing or wrong API key")
        browser.execute_script("document.getElementById('key').value = ''")   # no event
        enter_key(browser, "sk-page")
        assert browser.execute_script(STATUS) == ""          # the request with the key succeeded
        assert browser.execute_script(KEY_HINT) == ""
        assert speak(browser, "fine").endswith(" s")
    finally:
        s.stop()


def test_the_page_ships_as_package_data():
    """A non-editable install has the page: pyproject's package-data and MANIFEST.in (the sdist)
    name moss_tts/server/page.html, which is the file the `/` route serves."""
    import fnmatch
    import tomllib
    from pathlib import Path

    from moss_tts.server.app import page_html

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["moss_tts.server"]
    assert any(fnmatch.fnmatch("page.html", p) for p in patterns)
    assert "include moss_tts/server/page.html" in (root / "MANIFEST.in").read_text().splitlines()
    page = (root / "moss_tts" / "server" / "page.html").read_text(encoding="utf-8")
    assert page_html() == page and page.startswith("<!doctype html>") and 'id="speak"' in page
