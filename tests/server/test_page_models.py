"""The page over several served models in headless Chromium (issue 23, hole 9a and 9b): a model
picker, which Speak uses, shown only when there is a choice; a voice list holding only the
voices the picked model's codec made; and a screenshot check that a keyed server's page shows
what it should before and after the key (the DOM state asserted, the elements inside the shot).
Stub models (tests/server/helpers.py) with two codecs stand in for Nano and Delay."""

import struct
from types import SimpleNamespace

import numpy as np
import pytest

from moss_tts.reference import codec_info
from moss_tts.server import create_app
from moss_tts.voices import add_voice
from tests.server.helpers import Served, StubTTS, settings
from tests.server.test_page import (KEY_HINT, STATUS, VOICES, browser,  # noqa: F401 (fixture)
                                    enter_key, needs_browser, open_page, pick_model, speak)

MODEL = "return document.getElementById('model').value"
MODELS = "return [...document.getElementById('model').options].map(o => o.value)"


def stub(variant: str, rate: int) -> StubTTS:
    """A stub model whose codec is `variant` at `rate` (what its voices record)."""
    tts = StubTTS()
    tts.codec = SimpleNamespace(config=SimpleNamespace(variant=variant, codebook_size=1024),
                                sample_rate=rate, n_quantizers=2)
    return tts


@pytest.fixture
def two(tmp_path):
    """(name → stub model, voices root): Nano's codec made amy, Delay's made bob, and old was
    stored before voices recorded their codec (any model takes it)."""
    nano, delay = stub("nano", 48000), stub("v1", 24000)
    root = tmp_path / "voices"
    codes = np.zeros((4, 2), np.int32)      # [frames, the stub codec's 2 codebooks]
    add_voice("amy", codes, codec_info(nano.codec), root=root)
    add_voice("bob", codes, codec_info(delay.codec), root=root)
    add_voice("old", codes, {}, root=root)
    return {"moss-tts-nano": nano, "moss-tts-delay": delay}, root


def choose_voice(browser, name):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, "voice")).select_by_value(name)


@needs_browser
def test_speak_uses_the_picked_model(two, browser):
    """Speak sent every request to the first model; bob, a voice of the second, was refused."""
    from selenium.webdriver.common.by import By

    models, root = two
    s = Served(create_app(models, settings(root)))
    try:
        open_page(browser, s.url)
        assert browser.find_element(By.ID, "model").is_displayed()
        assert browser.execute_script(MODELS) == ["moss-tts-nano", "moss-tts-delay"]
        assert browser.execute_script(MODEL) == "moss-tts-nano"      # the server's default
        pick_model(browser, "moss-tts-delay")
        choose_voice(browser, "bob")
        assert speak(browser, "picked").endswith(" s")
        assert models["moss-tts-delay"].texts == ["picked"]
        assert models["moss-tts-nano"].texts == []
        pick_model(browser, "moss-tts-nano")
        assert speak(browser, "first").endswith(" s")
        assert models["moss-tts-nano"].texts == ["first"]
    finally:
        s.stop()


@needs_browser
def test_one_model_shows_no_picker(two, browser):
    from selenium.webdriver.common.by import By

    models, root = two
    s = Served(create_app({"moss-tts-nano": models["moss-tts-nano"]}, settings(root)))
    try:
        open_page(browser, s.url)
        assert browser.execute_script(MODELS) == ["moss-tts-nano"]
        assert not browser.find_element(By.ID, "model").is_displayed()
        assert browser.execute_script(VOICES) == ["", "amy", "old"]
    finally:
        s.stop()


@needs_browser
def test_the_voice_list_holds_the_picked_models_voices(two, browser):
    """The list mixed voices of every codec; a voice the picked model's codec did not make is
    left out, and a chosen voice stays chosen while it fits."""
    models, root = two
    s = Served(create_app(models, settings(root)))
    try:
        open_page(browser, s.url)
        assert browser.execute_script(VOICES) == ["", "amy", "old"]
        choose_voice(browser, "old")
        pick_model(browser, "moss-tts-delay")
        assert browser.execute_script(VOICES) == ["", "bob", "old"]
        assert browser.execute_script("return document.getElementById('voice').value") == "old"
        choose_voice(browser, "bob")
        pick_model(browser, "moss-tts-nano")            # bob is not Nano's: back to (none)
        assert browser.execute_script(VOICES) == ["", "amy", "old"]
        assert browser.execute_script("return document.getElementById('voice').value") == ""
    finally:
        s.stop()


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def shot(browser, path, shown: list[str], hidden: list[str]):
    """Saves a screenshot; each element in `shown` is displayed inside it, each in `hidden`
    is not displayed."""
    from selenium.webdriver.common.by import By

    assert browser.save_screenshot(str(path))
    width, height = png_size(path)
    for name in shown:
        element = browser.find_element(By.ID, name)
        r = element.rect
        assert element.is_displayed(), name
        assert 0 <= r["x"] and r["x"] + r["width"] <= width, (name, r, width)
        assert 0 <= r["y"] and r["y"] + r["height"] <= height, (name, r, height)
    for name in hidden:
        assert not browser.find_element(By.ID, name).is_displayed(), name


@needs_browser
def test_screenshots_of_a_keyed_server_with_two_models(two, browser, tmp_path):
    models, root = two
    s = Served(create_app(models, settings(root, api_key="sk-shot")))
    browser.set_window_size(1000, 800)
    try:
        open_page(browser, s.url)
        # before the key: the key field and its hint, no models to pick, no voices yet
        shot(browser, tmp_path / "needs-key.png", ["key", "key-hint", "speak"], ["model", "live"])
        assert browser.execute_script(KEY_HINT) == "this server needs an API key"
        assert browser.execute_script(VOICES) == [""]
        enter_key(browser, "sk-shot")
        pick_model(browser, "moss-tts-delay")
        shot(browser, tmp_path / "picked.png", ["key", "model", "voice", "speak"],
             ["key-hint", "live"])
        assert browser.execute_script(MODEL) == "moss-tts-delay"
        assert browser.execute_script(VOICES) == ["", "bob", "old"]
        assert browser.execute_script(KEY_HINT) == "" and browser.execute_script(STATUS) == ""
    finally:
        s.stop()


def test_models_list_gives_each_models_codec_and_the_real_input_limit(two):
    """What the page reads from /v1/models: each model's codec (in the fields a stored voice
    records), and `max_input_chars`, the limit the server enforces on `input` (one more
    character is refused) and on a live message's text."""
    import json

    from tests.server.helpers import call

    models, root = two
    s = Served(create_app(models, settings(root)))
    try:
        listed = json.loads(call(s.url, "/v1/models")[2])["data"]
        assert {m["id"]: m["codec"] for m in listed} == {
            "moss-tts-nano": {"variant": "nano", "sample_rate": 48000, "codebook_size": 1024},
            "moss-tts-delay": {"variant": "v1", "sample_rate": 24000, "codebook_size": 1024}}
        limit = listed[0]["max_input_chars"]
        speech = {"input": "x" * limit, "response_format": "pcm"}
        assert call(s.url, "/v1/audio/speech", speech)[0] == 200
        assert call(s.url, "/v1/audio/speech", speech | {"input": "x" * (limit + 1)})[0] == 413
    finally:
        s.stop()


class Designer(StubTTS):
    """A stub of MOSS-VoiceGenerator's family (no reference; `instruction` required) that
    records the instruction each request gave it."""

    FAMILY = "voicegen"

    def __init__(self):
        super().__init__()
        self.instructions = []

    def stream(self, text, **kwargs):
        self.instructions.append(kwargs.get("instruction"))
        return super().stream(text, **kwargs)


class SoundMaker(StubTTS):
    FAMILY = "sfx"      # MOSS-SoundEffect's: no voice, no reference, no instruction


@pytest.fixture
def three(tmp_path):
    """A cloning model (Nano's family), a voice designer and a sound maker, one stored voice."""
    root = tmp_path / "voices"
    nano = stub("stub", 1600)
    add_voice("amy", np.zeros((4, 2), np.int32), codec_info(nano.codec), root=root)
    return {"moss-tts-nano": nano, "moss-tts-voicegen": Designer(),
            "moss-tts-sfx": SoundMaker()}, root


def test_models_list_says_which_fields_each_model_takes(three):
    """/v1/models gave no way to tell that VoiceGenerator needs `instruction` and refuses
    `reference_audio`: each entry lists the request fields its model takes and requires."""
    import json

    from tests.server.helpers import call

    models, root = three
    s = Served(create_app(models, settings(root)))
    try:
        listed = {m["id"]: m for m in json.loads(call(s.url, "/v1/models")[2])["data"]}
    finally:
        s.stop()
    nano, designer, sfx = (listed[n] for n in models)
    assert {"voice", "reference_audio", "seed"} <= set(nano["fields"])
    assert "instruction" not in nano["fields"] and nano["required"] == []
    assert "instruction" in designer["fields"] and designer["required"] == ["instruction"]
    assert not {"voice", "reference_audio"} & set(designer["fields"] + sfx["fields"])
    assert "sound" in sfx["fields"] and "instruction" not in sfx["fields"]
    assert all(m["object"] == "model" for m in listed.values())      # OpenAI's shape kept


SHOWN = ("return ['voice-label', 'reference-label', 'instruction-row']"
         ".filter(id => !document.getElementById(id).hidden)")


@needs_browser
def test_the_page_offers_each_model_the_inputs_it_takes(three, browser):
    """The page offered VoiceGenerator no instructions field (it cannot speak without one) and
    a reference input to models that refuse one; now each picked model shows its own inputs,
    and the instructions typed reach the voice designer."""
    from selenium.webdriver.common.by import By

    models, root = three
    s = Served(create_app(models, settings(root)))
    try:
        open_page(browser, s.url)
        assert browser.execute_script(SHOWN) == ["voice-label", "reference-label"]
        pick_model(browser, "moss-tts-voicegen")
        assert browser.execute_script(SHOWN) == ["instruction-row"]
        field = browser.find_element(By.ID, "instruction")
        assert field.is_displayed() and field.get_attribute("required") is not None
        assert speak(browser, "No instruction.").startswith("error: 'instruction'")  # the 400
        field.send_keys("A calm, low voice.")
        assert speak(browser, "Designed.").endswith(" s")
        assert models["moss-tts-voicegen"].instructions == ["A calm, low voice."]
        pick_model(browser, "moss-tts-sfx")
        assert browser.execute_script(SHOWN) == []
        assert speak(browser, "rain on a roof").endswith(" s")
        assert models["moss-tts-sfx"].texts == ["rain on a roof"]
        pick_model(browser, "moss-tts-nano")            # the inputs come back
        assert browser.execute_script(SHOWN) == ["voice-label", "reference-label"]
    finally:
        s.stop()
