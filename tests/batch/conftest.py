"""Tiny Nano models (fixtures.make_nano, through the real converter) and helpers for running
the batch command on them."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from converters.nano import convert as convert_nano
from fixtures.make_nano import make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm
from moss_tts.voices import add_voice

SR = 1600           # the tiny Nano codec's rate
FRAMES = 10         # stop_bias −50 never stops: every line is exactly FRAMES frames of 32 samples
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """A user cache of the test's own (model hashes land there), never the real one."""
    monkeypatch.setenv("MOSS_TTS_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def batch_models(tmp_path_factory, tiny_codec):
    """Two tiny Nano GGUFs (seeds 0 and 1) and the tiny stereo codec GGUF."""
    d = tmp_path_factory.mktemp("batch_models")
    spm = make_tiny_spm()
    out = {"codec": tiny_codec("nano", seed=1)}
    for seed in (0, 1):
        ckpt = make_tiny_nano_tts_checkpoint(d / f"tts{seed}", seed=seed, tokenizer_model_bytes=spm,
                                             audio_tokenizer_sample_rate=SR, stop_bias=-50)
        out[f"nano{seed}"] = convert_nano(ckpt, d / f"nano{seed}.gguf")
    return out


@pytest.fixture(scope="session")
def voice_env(tmp_path_factory):
    """A stored voice 'alice' (random codes) and a reference WAV, as a worker would find them."""
    d = tmp_path_factory.mktemp("voices")
    codes = np.random.default_rng(5).integers(0, 64, size=(12, 4))
    add_voice("alice", codes, {"source": "test"}, root=d / "voices")
    t = np.arange(SR) / SR
    sf.write(d / "ref.wav", np.stack([0.3 * np.sin(2 * np.pi * 110 * t),
                                      0.2 * np.sin(2 * np.pi * 70 * t)], 1).astype(np.float32), SR)
    return {"root": d / "voices", "codes": codes, "ref": d / "ref.wav"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def speech_rows(n, **extra):
    return [{"id": f"line{i:03d}", "text": f"Sentence number {i}.", "max_frames": FRAMES, **extra}
            for i in range(n)]


def batch_cli(manifest, out, models, *extra, popen=False, env=None, replace_env=False,
              timeout=None):
    """`python -m moss_tts batch` in a child process, run from this checkout (`env` added to
    this process's environment, or instead of it with replace_env)."""
    cmd = [sys.executable, "-m", "moss_tts", "batch", str(manifest), "--out", str(out),
           "--model", str(models["nano0"]), "--codec", str(models["codec"]), *map(str, extra)]
    env = {**({} if replace_env else os.environ), "MOSS_TTS_THREADS": "1", **(env or {})}
    if popen:   # its own process group, so a test can signal the driver and its workers at once
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def records(out):
    """results.jsonl as a list of dicts (every record, in order)."""
    return [json.loads(t) for t in (out / "results.jsonl").read_text().splitlines() if t.strip()]


def outputs(out):
    """{file name: sample bytes} of the audio files in a batch output directory (the samples:
    libsndfile stamps the time into a float WAV's PEAK chunk)."""
    return {p.name: read(p).tobytes() for p in sorted(out.iterdir())
            if p.suffix in (".wav", ".flac")}


def no_partials(out):
    return not [p for p in out.iterdir() if p.name.endswith(".partial")]


def read(path, channels=2):
    """The samples a file stores: 16-bit, the package's default sample format (the tiny Nano
    codec's rate unless another family's mono file)."""
    audio, sr = sf.read(path, dtype="int16", always_2d=True)
    assert audio.shape[1] == channels and (channels != 2 or sr == SR)
    return audio
