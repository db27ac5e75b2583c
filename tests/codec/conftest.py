"""The tiny v1 codec (the session's `tiny_codec()`, tests/conftest.py) loaded through the real
loader (style C30), its checkpoint for the numpy reference, the clips the codec tests share, and
`run_isolated` for checks that may crash the process."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures.make_codec import load_config, load_state
from moss_tts.codec import Codec

CLIP_SECONDS = 3.0  # 150 code frames: longer than the 0.5 s window of every stage
# The tiny codec's ops take microseconds; on a busy machine several ggml threads mostly wait on
# each other (10× slower measured on 2 loaded cores). test_codec checks that the count does not
# change results.
THREADS = 1


@pytest.fixture(scope="session")
def codec_gguf(tiny_codec):
    return tiny_codec()


@pytest.fixture(scope="session")
def tiny_checkpoint(codec_gguf):
    """The checkpoint the GGUF was converted from (beside it: fixtures.make_codec)."""
    return codec_gguf.parent / "hf"


@pytest.fixture(scope="session")
def reference_model(tiny_checkpoint):
    """(state dict, config.json dict) for fixtures.reference.codec."""
    return load_state(tiny_checkpoint), load_config(tiny_checkpoint)


@pytest.fixture(scope="session")
def codec(codec_gguf):
    c = Codec.load(codec_gguf, threads=THREADS)
    # Run the largest graphs first, so the shared codec's compute allocators never grow later
    # and the in-process tests do not depend on their order; growing and then replaying an older
    # graph is checked on its own, in a fresh interpreter (test_shorter_input_after_longer_input).
    c.decode(np.zeros((c.n_quantizers, c.chunk_frames), np.int32))
    c.encode(np.zeros(c.chunk_frames * c.downsample_rate, np.float32), c.sample_rate)
    yield c
    c.close()


def make_clip(seconds, sample_rate, *, seed):
    """Seeded test audio: a few partials with a moving pitch plus noise (never silence)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    x = 0.1 * rng.standard_normal(t.shape)
    for f0, amp in ((110.0, 0.4), (347.0, 0.25), (901.0, 0.15)):
        x += amp * np.sin(2 * np.pi * f0 * t * (1 + 0.05 * np.sin(2 * np.pi * 0.7 * t)))
    return x.astype(np.float32)


@pytest.fixture(scope="session")
def clip(codec):
    return make_clip(CLIP_SECONDS, codec.sample_rate, seed=11)


REPO = Path(__file__).resolve().parents[2]
_CALL = ("import importlib, sys; "
         "getattr(importlib.import_module(sys.argv[1]), sys.argv[2])(*sys.argv[3:])")


def run_isolated(func, *args) -> str:
    """Run module-level `func(*args)` (string arguments) in a fresh interpreter, so that a native
    crash fails one test instead of ending the session. Freed heap memory is filled with a byte
    pattern, so a use-after-free shows up as wrong numbers where it does not crash."""
    env = {**os.environ, "MALLOC_PERTURB_": "165",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CALL, func.__module__,
                        func.__name__, *map(str, args)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode:
        how = (f"killed by {signal.Signals(-r.returncode).name}" if r.returncode < 0
               else f"exit status {r.returncode}")
        tail = "\n".join(r.stderr.strip().splitlines()[-12:])
        pytest.fail(f"{func.__name__}{args!r} in a fresh interpreter: {how}\n{tail}", pytrace=False)
    return r.stdout
