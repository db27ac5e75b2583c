"""`python -m moss_tts tts`: the family comes from the model GGUF (tiny Nano and tiny Delay),
the same audio as the Python API for the same seed, to a file and streamed to stdout; flags
of another family are refused in one line before the model loads."""

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from converters.delay import convert as convert_delay
from converters.nano import convert as convert_nano
from fixtures.make_delay import SAMPLE_RATE as DELAY_SR, make_tiny_delay_checkpoint
from fixtures.make_nano import make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm
from moss_tts.cli import main
from moss_tts.models.delay_tts import DelayTTS
from moss_tts.sampling import DelaySamplingOptions

NANO_SR = 1600
TEXT = "Hello there."


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_codec):
    d = tmp_path_factory.mktemp("tts_families")
    nano = make_tiny_nano_tts_checkpoint(d / "nano", seed=0, tokenizer_model_bytes=make_tiny_spm(),
                                         audio_tokenizer_sample_rate=NANO_SR, stop_bias=-50)
    return {
        "nano": convert_nano(str(nano), d / "nano.gguf"),
        "nano_codec": tiny_codec("nano", seed=1),
        # gen_bias 4 makes the tiny Delay model start audio at once (tests/models/test_delay_tts)
        "delay": convert_delay(str(make_tiny_delay_checkpoint(d / "delay", seed=0, gen_bias=4.0)),
                               d / "delay.gguf", strict=True),
        "delay_codec": tiny_codec(),
    }


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                          capture_output=True, env=dict(os.environ) | (env or {}))


def delay_args(models, *extra):
    return ("tts", "--model", models["delay"], "--codec", models["delay_codec"], "--text", TEXT,
            "--seed", 7, "--max-new-rows", 24, "--threads", 1, *extra)


def test_delay_through_tts_equals_the_api_to_a_file_and_to_stdout(models, tmp_path):
    out = tmp_path / "d.wav"
    r = cli(*delay_args(models, "--sample-format", "f32", "-o", out))
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(out, dtype="float32", always_2d=True)
    with DelayTTS.load(models["delay"], codec=models["delay_codec"], threads=1) as tts:
        want, _ = tts.synthesize(TEXT, options=DelaySamplingOptions(), seed=7, max_new_rows=24)
    assert sr == DELAY_SR and audio.shape[1] == 1 and len(audio) > 0
    np.testing.assert_array_equal(audio, want)          # f32 WAV: the samples as made
    raw = cli(*delay_args(models, "--sample-format", "f32", "-o", "-", "--format", "raw"))
    assert raw.returncode == 0, raw.stderr
    # stdout streams, its codec pushes paced by the clock (chunk_ladder.py): the codec's sums
    # round otherwise than the file's fixed pushes, to f32 kernel order
    np.testing.assert_allclose(np.frombuffer(raw.stdout, "<f4").reshape(-1, 1), want, atol=1e-5)


def test_delay_greedy_and_duration_flags_reach_the_model(models, tmp_path):
    """--greedy, and --seconds / --language (the prompt's fields). The tiny model's greedy
    codes barely depend on the prompt, so the fields are shown to matter with sampled draws
    (seed 7), which any change of the logits moves."""
    a, b, c = tmp_path / "a.wav", tmp_path / "b.wav", tmp_path / "c.wav"
    f32 = ("--sample-format", "f32")
    fields = ("--seconds", 0.5, "--language", "en")
    assert cli(*delay_args(models, *f32, "--greedy", "-o", a)).returncode == 0
    r = cli(*delay_args(models, *f32, *fields, "-o", b))
    assert r.returncode == 0, r.stderr
    assert cli(*delay_args(models, *f32, "-o", c)).returncode == 0
    with DelayTTS.load(models["delay"], codec=models["delay_codec"], threads=1) as tts:
        greedy = DelaySamplingOptions().greedy()
        plain_greedy, _ = tts.synthesize(TEXT, options=greedy, max_new_rows=24)
        want, _ = tts.synthesize(TEXT, seed=7, max_new_rows=24, seconds=0.5, language="en")
        plain, _ = tts.synthesize(TEXT, seed=7, max_new_rows=24)
    np.testing.assert_array_equal(sf.read(a, dtype="float32", always_2d=True)[0], plain_greedy)
    np.testing.assert_array_equal(sf.read(b, dtype="float32", always_2d=True)[0], want)
    np.testing.assert_array_equal(sf.read(c, dtype="float32", always_2d=True)[0], plain)
    assert want.shape != plain.shape or not np.array_equal(want, plain)   # the fields matter
    assert plain.shape != plain_greedy.shape or not np.array_equal(plain, plain_greedy)


def test_delay_continuation_from_the_cli_equals_the_api(models, tmp_path):
    """--prompt-audio + --prompt-text continue a recording on Delay too: the transcript, then
    the new text (upstream's continuation text), after the prompt audio's frames."""
    prompt_wav = tmp_path / "prompt.wav"
    t = np.arange(int(0.4 * DELAY_SR)) / DELAY_SR
    sf.write(prompt_wav, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), DELAY_SR)
    out = tmp_path / "c.wav"
    r = cli(*delay_args(models, "--greedy", "--sample-format", "f32", "--prompt-audio",
                        prompt_wav, "--prompt-text", "Prompt words.", "-o", out))
    assert r.returncode == 0, r.stderr
    greedy = DelaySamplingOptions().greedy()
    with DelayTTS.load(models["delay"], codec=models["delay_codec"], threads=1) as tts:
        prompt = tts.encode_reference(*sf.read(prompt_wav, dtype="float32"), max_seconds=None)
        want, _ = tts.synthesize("Prompt words. " + TEXT, prompt=prompt, options=greedy,
                                 max_new_rows=24)
        fresh, _ = tts.synthesize(TEXT, options=greedy, max_new_rows=24)
    np.testing.assert_array_equal(sf.read(out, dtype="float32", always_2d=True)[0], want)
    assert want.shape != fresh.shape or not np.array_equal(want, fresh)


def test_a_voice_of_another_codec_is_refused_naming_the_fix(models, tmp_path):
    env = {"MOSS_TTS_VOICES": str(tmp_path / "voices")}
    ref = tmp_path / "ref.wav"
    t = np.arange(NANO_SR) / NANO_SR
    sf.write(ref, np.stack([0.3 * np.sin(2 * np.pi * 200 * t)] * 2, 1).astype(np.float32),
             NANO_SR)
    r = cli("voice", "add", "alice", ref, "--codec", models["nano_codec"], env=env)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "o.wav"
    r = cli(*delay_args(models, "--voice", "alice", "-o", out), env=env)
    assert r.returncode != 0 and not out.exists()
    err = r.stderr.decode().strip()
    assert len(err.splitlines()) == 1
    assert "voice 'alice' does not fit this model: it was encoded with the v2 codec" in err
    assert "voice add alice REF.wav --codec CODEC --force" in err


def test_nano_through_tts_equals_tts_nano(models, tmp_path):
    outs = []
    for command in ("tts", "tts-nano"):
        out = tmp_path / f"{command}.wav"
        r = cli(command, "--model", models["nano"], "--codec", models["nano_codec"], "--text",
                TEXT, "--seed", 3, "--max-frames", 12, "--top-k", 5, "-o", out)
        assert r.returncode == 0, r.stderr
        outs.append(sf.read(out, dtype="float32")[0])
    assert outs[0].shape == (12 * 32, 2)
    np.testing.assert_array_equal(outs[0], outs[1])


def in_process(capsys, *args) -> str:
    assert main([str(a) for a in args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flag, value, family", [
    ("--max-frames", 5, "delay"), ("--voice-clone-max-text-tokens", 5, "delay"),
    ("--language", "en", "nano"),
    ("--instruction", "calm", "nano"), ("--tokens", 5, "nano"), ("--seconds", 1, "nano"),
    ("--text-top-k", 5, "nano"), ("--text-top-p", 0.5, "nano"), ("--max-new-rows", 5, "nano")])
def test_a_flag_of_another_family_is_one_line_naming_flag_and_family(models, tmp_path, capsys,
                                                                     flag, value, family):
    extra = (flag, value) + (("--prompt-audio", models["nano"]) if flag == "--prompt-text" else ())
    out = tmp_path / "o.wav"
    err = in_process(capsys, "tts", "--model", models[family], "--codec",
                     models[f"{family}_codec"], "--text", "hi", "-o", out, *extra)
    name = {"nano": "MOSS-TTS-Nano", "delay": "MOSS-TTS (Delay)"}[family]
    assert f"{flag} is not a {name} option" in err
    assert not out.exists()


def test_a_language_the_model_card_lacks_is_one_line_listing_them(models, tmp_path):
    """`tts --language xx` on Delay: one line naming --language and the card's languages,
    exit 1, nothing written (checked with the other knobs, before the model loads)."""
    out = tmp_path / "o.wav"
    r = cli(*delay_args(models, "--language", "xx", "-o", out))
    err = r.stderr.decode()
    assert r.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith("error: --language 'xx' is not one of this model's 31 languages; "
                          "give a name or code from its model card: Chinese (zh), Cantonese "
                          "(yue), English (en), ")
    assert "Persian (Farsi) (fa)" in err and err.rstrip().endswith("Vietnamese (vi)")
    assert not out.exists()


def test_tts_nano_refuses_a_delay_model_and_delay_takes_its_familys_codec(models, tmp_path,
                                                                         capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")      # the default codec is a repo id: no network
    out = tmp_path / "o.wav"
    err = in_process(capsys, "tts-nano", "--model", models["delay"], "--text", "hi", "-o", out)
    assert "a MOSS-TTS (Delay) model" in err and "python -m moss_tts tts" in err
    err = in_process(capsys, "tts", "--model", models["delay"], "--text", "hi", "-o", out)
    assert "--codec OpenMOSS-Team/MOSS-Audio-Tokenizer: not in the local Hugging Face" in err
    err = in_process(capsys, "tts", "--model", models["delay"], "--codec", models["nano_codec"],
                     "--text", "hi", "-o", out)
    assert "mismatched codec" in err
    assert not out.exists()


def test_help_shows_each_familys_default_from_its_dataclass(capsys):
    with pytest.raises(SystemExit):
        main(["tts", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("(default: Nano 0.8, Delay 1.7, TTSD 1.1, VoiceGenerator 1.5, SoundEffect 1.5, "
            "Local 1.0, Local v1.5 1.7, Realtime 0.8)" in text)           # --temperature
    assert ("(default: Delay 50, TTSD 50, VoiceGenerator 50, SoundEffect 50, Local 50, "
            "Local v1.5 50)" in text)                                     # --text-top-k
