"""The page's live mode in headless Chromium with the tiny MOSS-TTS-Realtime model: it shows
only when a live model is picked, text typed into it is spoken turn by turn (the bytes the page
receives are the offline speech of that text for the seed), it sends the API key, and a paste
longer than one message may hold is sent in pieces (with a stub live model)."""


import numpy as np
import pytest

from moss_tts.models.nano_tts import NanoTTS
from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.sampling import RealtimeSamplingOptions
from moss_tts.server import create_app
from moss_tts.server.formats import pcm_bytes
from tests.server.helpers import Served, settings, tiny_model_files, tiny_realtime_files
from tests.server.test_page import (browser, enter_key, needs_browser, open_page,  # noqa: F401
                                    pick_model, wait_for)                 # (browser: the fixture)

TEXT = "Hello there, this is typed live."
MORE = " And a second turn."


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("page_live")
    realtime, codec = tiny_realtime_files(d)
    nano, nano_codec = tiny_model_files(d, rate=16000)
    rt = RealtimeTTS.load(realtime, codec=codec, threads=1)
    nano_tts = NanoTTS.load(nano, codec=nano_codec, threads=1)
    yield {"moss-tts-nano": nano_tts, "moss-tts-realtime": rt}
    rt.close()
    nano_tts.close()


def live_hidden(browser) -> bool:
    return browser.execute_script("return document.getElementById('live').hidden")


def start_live(browser, seed="5"):
    from selenium.webdriver.common.by import By

    browser.find_element(By.ID, "seed").clear()
    browser.find_element(By.ID, "seed").send_keys(seed)
    browser.find_element(By.ID, "live-text").clear()
    browser.find_element(By.ID, "live-start").click()


STATUS = "return document.getElementById('live-status').textContent"


@needs_browser
def test_live_mode_speaks_typed_text_turn_by_turn(models, browser, tmp_path):
    from selenium.webdriver.common.by import By

    s = Served(create_app(models, settings(tmp_path)))
    try:
        open_page(browser, s.url)
        assert live_hidden(browser)                   # the first model, Nano, has no live mode
        pick_model(browser, "moss-tts-realtime")
        assert not live_hidden(browser)
        start_live(browser)
        wait_for(browser, STATUS, "live: type or paste")
        box = browser.find_element(By.ID, "live-text")
        box.send_keys(TEXT)                         # one input event per key: deltas
        # End, then more text in the same JS task: it is typed before turn_done can arrive,
        # and must wait for it (a turn sent earlier would cut the first turn short)
        browser.execute_script(
            "document.getElementById('live-end').click();"
            "const box = document.getElementById('live-text'); box.value += arguments[0];"
            "box.dispatchEvent(new Event('input'));", MORE)
        wait_for(browser, "return window.liveDone.length", 1)
        want, _ = models["moss-tts-realtime"].synthesize(TEXT, seed=5)
        done = browser.execute_script("return window.liveDone[0]")
        assert done["interrupted"] is False                  # the first turn was not cut
        assert done["seconds"] == pytest.approx(len(want) / 3200, abs=1e-3)
        browser.find_element(By.ID, "live-end").click()
        wait_for(browser, "return window.liveDone.length", 2)
        assert browser.execute_script("return window.liveDone[1].seconds") > 0
        assert browser.execute_script(STATUS).startswith("turn done: ")
        assert browser.execute_script("return window.liveBytes") > len(pcm_bytes(want)) > 0
        browser.find_element(By.ID, "live-start").click()     # Stop
        wait_for(browser, STATUS, "closed", 10)
    finally:
        s.stop()


@needs_browser
def test_live_mode_is_hidden_without_a_live_model(models, browser, tmp_path):
    s = Served(create_app({"moss-tts-nano": models["moss-tts-nano"]}, settings(tmp_path)))
    try:
        # the section starts hidden: the check means something only once the page has read
        # /v1/models (open_page waits for that)
        open_page(browser, s.url)
        assert browser.execute_script("return window.liveModel") is None
        assert live_hidden(browser)
    finally:
        s.stop()


@needs_browser
def test_live_mode_sends_the_api_key(models, browser, tmp_path):
    from selenium.webdriver.common.by import By

    s = Served(create_app(models, settings(tmp_path, api_key="sk-live")))
    try:
        open_page(browser, s.url)
        assert live_hidden(browser)                 # /v1/models needs the key too
        enter_key(browser, "sk-live")
        pick_model(browser, "moss-tts-realtime")
        assert not live_hidden(browser)
        start_live(browser)
        wait_for(browser, STATUS, "live: type or paste")
        browser.find_element(By.ID, "live-start").click()     # Stop
        wait_for(browser, STATUS, "closed", 10)
        browser.execute_script("document.getElementById('key').value = ''")   # no event
        browser.find_element(By.ID, "live-start").click()     # again, without the key
        wait_for(browser, STATUS, "error: refused (is the API key right?)")
    finally:
        s.stop()


class PasteSession:
    """Keeps the text it is pushed (one string per session in `texts`); says nothing until the
    turn's end, then a short chunk."""

    # what the live server reads of a session after each turn (its context, a budget cut)
    rows, budget_cut, turns_dropped = (0, 2048), False, 0
    max_turn_chars = 32 * 2048         # read once, when the session opens

    def __init__(self, texts: list):
        self.texts = texts
        texts.append("")

    def push_text(self, ch):
        self.texts[-1] += ch
        return np.zeros(0, np.float32)

    def end_text(self):
        pass

    def drain(self):
        yield np.full(320, 0.1, np.float32)

    def new_turn(self, user_text=None):
        pass

    def close(self):
        pass


class PasteModel:
    """A live model whose sessions keep what the page sent them."""

    sample_rate, channels, OPTIONS, FAMILY = 3200, 1, RealtimeSamplingOptions, RealtimeTTS.FAMILY
    BATCHED, LIVE = None, True

    def __init__(self):
        self.texts: list[str] = []

    def session(self, voice=None, **kwargs):
        return PasteSession(self.texts)


# longer than the server takes in one message (request.MAX_INPUT_CHARS), with a character
# outside the BMP (two UTF-16 units) across the first 4,096-unit boundary: a cut inside it
# would send two halves the server cannot join back
LONG_PASTE = ("A long pasted text. " * 205)[:4095] + "\U0001F600" + " And on it goes." * 80


@needs_browser
def test_a_long_paste_is_sent_in_pieces_and_again_after_a_restart(browser, tmp_path):
    """Issue 23, hole 9d: a paste past the per-message limit was one message, which the server
    refused, ending the session; a restart sent the same text and failed again."""
    from selenium.webdriver.common.by import By

    model = PasteModel()
    s = Served(create_app({"moss-tts-realtime": model}, settings(tmp_path)))
    paste = ("const box = document.getElementById('live-text'); box.value = arguments[0];"
             "box.dispatchEvent(new Event('input'));")
    try:
        open_page(browser, s.url)
        start_live(browser)
        wait_for(browser, STATUS, "live: type or paste")
        browser.execute_script(paste, LONG_PASTE)
        browser.find_element(By.ID, "live-end").click()
        wait_for(browser, "return window.liveDone.length", 1)
        assert model.texts == [LONG_PASTE]
        assert browser.execute_script(STATUS).startswith("turn done: ")
        browser.find_element(By.ID, "live-start").click()     # Stop
        wait_for(browser, STATUS, "closed", 10)
        browser.find_element(By.ID, "live-start").click()     # a restart speaks the box again
        wait_for(browser, STATUS, "live: type or paste")
        browser.find_element(By.ID, "live-end").click()
        wait_for(browser, "return window.liveDone.length", 1)
        assert model.texts == [LONG_PASTE, LONG_PASTE]
    finally:
        s.stop()
