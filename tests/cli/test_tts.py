"""tts-nano, voice and the hub resolution end to end on the tiny models (no network)."""

import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_nano import make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm

SR = 1600  # the tiny Nano codec's rate


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_codec):
    d = tmp_path_factory.mktemp("tts")
    tts_dir = make_tiny_nano_tts_checkpoint(d / "tts", seed=0, tokenizer_model_bytes=make_tiny_spm(),
                                            audio_tokenizer_sample_rate=SR, stop_bias=-50)
    return {"dir": d, "tts_dir": tts_dir, "codec": tiny_codec("nano", seed=1),
            "mono_codec": tiny_codec("v1", seed=1)}


def cli(*args, env=None, stdin=None):
    import os
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)], capture_output=True,
                          env={**os.environ, **(env or {})}, input=stdin)


def test_convert_then_speak_to_wav_and_to_stdout(models, tmp_path):
    gguf = tmp_path / "nano.gguf"
    r = cli("convert", "nano", "--model", models["tts_dir"], "--out", gguf, "--strict")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "a.wav"
    r = cli("tts-nano", "--model", gguf, "--codec", models["codec"], "--text", "Hello world.",
            "--seed", 3, "--max-frames", 20, "-o", out)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(out, dtype="float32")
    assert sr == SR and audio.shape == (20 * 32, 2) and np.isfinite(audio).all()
    raw = cli("tts-nano", "--model", gguf, "--codec", models["codec"], "--text", "Hello world.",
              "--seed", 3, "--max-frames", 20, "-o", "-", "--format", "raw").stdout
    pcm = np.frombuffer(raw, "<i2").reshape(-1, 2)
    want = np.round(np.clip(audio, -1, 1) * 32767).astype(np.int16)  # same seed, same audio
    assert np.abs(pcm.astype(int) - want).max() <= 1
    wav = cli("tts-nano", "--model", gguf, "--codec", models["codec"], "--text", "Hello world.",
              "--seed", 3, "--max-frames", 20, "-o", "-").stdout
    assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE" and len(wav) == 44 + len(raw)


def test_text_from_stdin_and_a_repo_directory_converted_into_the_cache(models, tmp_path):
    env = {"MOSS_TTS_CACHE": str(tmp_path / "cache")}
    r = cli("tts-nano", "--model", models["tts_dir"], "--codec", models["codec"], "--greedy",
            "--max-frames", 8, "-o", tmp_path / "s.flac", env=env, stdin=b"Hello from stdin.")
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "cache" / "gguf").glob("*.gguf"))
    assert sf.info(tmp_path / "s.flac").channels == 2


def test_voice_add_use_list_remove(models, tmp_path):
    env = {"MOSS_TTS_VOICES": str(tmp_path / "voices")}
    t = np.arange(2 * SR) / SR
    ref = tmp_path / "ref.wav"
    sf.write(ref, np.stack([0.3 * np.sin(2 * np.pi * 200 * t), 0.1 * np.sin(2 * np.pi * 90 * t)], 1)
             .astype(np.float32), SR)
    assert cli("voice", "add", "alice", ref, "--codec", models["codec"], env=env).returncode == 0
    assert b"alice" in cli("voice", "list", env=env).stdout
    tts = tmp_path / "nano.gguf"
    cli("convert", "nano", "--model", models["tts_dir"], "--out", tts)
    a = tmp_path / "a.wav"
    b = tmp_path / "b.wav"
    for path, extra in ((a, ("--voice", "alice")), (b, ("--reference", ref))):
        r = cli("tts-nano", "--model", tts, "--codec", models["codec"], "--text", "Hi there.",
                "--greedy", "--max-frames", 10, "-o", path, *extra, env=env)
        assert r.returncode == 0, r.stderr
    # the stored voice is the reference's codes: the same output as encoding it again
    assert np.array_equal(sf.read(a)[0], sf.read(b)[0])
    assert cli("voice", "remove", "alice", env=env).returncode == 0
    assert b"alice" not in cli("voice", "list", env=env).stdout


@pytest.mark.parametrize("case", ["mismatched_codec", "model_is_a_codec", "empty_text",
                                  "missing_reference", "bad_suffix", "unknown_voice",
                                  "voice_path_traversal"])
def test_bad_input_is_one_line_and_writes_nothing(models, tmp_path, case):
    tts = tmp_path / "nano.gguf"
    cli("convert", "nano", "--model", models["tts_dir"], "--out", tts)
    out = tmp_path / "o.wav"
    base = ("tts-nano", "--model", tts, "--codec", models["codec"], "-o", out)
    args, stdin = {
        "mismatched_codec": (("tts-nano", "--model", tts, "--codec", models["mono_codec"],
                              "--text", "hi", "-o", out), None),
        "model_is_a_codec": (("tts-nano", "--model", models["codec"], "--codec", models["codec"],
                              "--text", "hi", "-o", out), None),
        "empty_text": (base + ("--text", "   "), None),
        "missing_reference": (base + ("--text", "hi", "--reference", tmp_path / "no.wav"), None),
        "bad_suffix": (("tts-nano", "--model", tts, "--codec", models["codec"], "--text", "hi",
                        "-o", tmp_path / "o.mp3"), None),
        "unknown_voice": (base + ("--text", "hi", "--voice", "nobody"), None),
        "voice_path_traversal": (("voice", "add", "../x", tmp_path / "no.wav", "--codec",
                                  models["codec"]), None),
    }[case]
    r = cli(*args, stdin=stdin, env={"MOSS_TTS_VOICES": str(tmp_path / "voices")})
    err = r.stderr.decode()
    assert r.returncode == 1 and err.startswith("error: ") and err.count("\n") == 1, err
    assert not out.exists() and not (tmp_path / "o.mp3").exists()


def test_a_cut_at_the_frame_budget_shows_on_stderr_once_and_quiet_silences_it(models, tmp_path):
    """The tiny model never stops (stop_bias -50): --max-frames cuts every chunk, and says so in
    one warning line; --quiet silences it (issue 22 #6)."""
    env = {"MOSS_TTS_CACHE": str(tmp_path / "cache")}
    args = ("tts-nano", "--model", models["tts_dir"], "--codec", models["codec"], "--greedy",
            "--text", "Hello there. How are you today?", "--max-frames", 4)
    r = cli(*args, "-o", tmp_path / "a.wav", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(b"warning:") == 1, r.stderr
    assert b"frame budget (4 frames" in r.stderr and b"audio is cut" in r.stderr
    r = cli(*args, "--quiet", "-o", tmp_path / "b.wav", env=env)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
