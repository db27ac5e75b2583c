"""The served page in a real headless Chromium: it loads, speaks with the tiny model, and its
audio element receives the streamed audio. Needs Debian's chromium + chromium-driver (installed
by .ci/run); without them the test is skipped with that reason."""

import json
import shutil
import time

import pytest

from converters.codec import convert as convert_codec
from converters.nano import convert as convert_nano
from fixtures.make_codec import make_tiny_nano_checkpoint
from fixtures.make_nano import make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm
from moss_tts.models.nano_tts import NanoTTS
from moss_tts.server import create_app
from tests.server_helpers import Served

# Browsers decode WAV only from 3 kHz up: the tiny codec is declared at 16 kHz here (its
# windows scale with the rate; the towers are unchanged).
RATE = 16000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("web")
    codec_dir = make_tiny_nano_checkpoint(d / "codec", seed=1)
    config = json.loads((codec_dir / "config.json").read_text())
    config["sampling_rate"] = config["sample_rate"] = RATE
    (codec_dir / "config.json").write_text(json.dumps(config))
    tts_dir = make_tiny_nano_tts_checkpoint(d / "tts", seed=0, tokenizer_model_bytes=make_tiny_spm(),
                                            audio_tokenizer_sample_rate=RATE, stop_bias=-50)
    tts = NanoTTS.load(convert_nano(tts_dir, d / "nano.gguf"),
                       codec=convert_codec(codec_dir, d / "codec.gguf"), threads=1)
    s = Served(create_app(tts, voices_root=d / "voices"))
    yield s
    s.stop()
    tts.close()

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="chromium and chromedriver are not installed")
def test_page_speaks_and_the_audio_element_receives_data(server):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--autoplay-policy=no-user-gesture-required"):
        opts.add_argument(flag)
    browser = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        browser.get(server.url + "/")
        assert browser.title == "moss-tts"
        browser.find_element(By.ID, "text").clear()
        browser.find_element(By.ID, "text").send_keys("Hello there.")
        browser.find_element(By.ID, "seed").send_keys("5")
        browser.find_element(By.ID, "speak").click()
        deadline = time.time() + 60
        while time.time() < deadline:
            src = browser.execute_script("return document.getElementById('player').src")
            if src.startswith("blob:"):
                break
            time.sleep(0.1)
        received = browser.execute_script("return window.receivedBytes")
        duration = browser.execute_script(
            "const p = document.getElementById('player'); return new Promise(r => "
            "p.readyState >= 1 ? r(p.duration) : p.addEventListener('loadedmetadata', () => r(p.duration)))")
        assert src.startswith("blob:"), browser.find_element(By.ID, "status").text
        assert received > 0 and duration > 0
        assert browser.find_element(By.ID, "download").get_attribute("href") == src
    finally:
        browser.quit()
