"""Long audio through the codec: `encode_blocks` gives exactly `encode`'s codes while holding a
block at a time, and `python -m moss_tts encode` of a long file runs in memory that does not
grow with its length (moss_tts/codec/codec.py, audio.read_audio_blocks)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from .conftest import make_clip

REPO = Path(__file__).resolve().parents[2]


def _blocks(x, rng):
    i = 0
    while i < len(x):
        n = int(rng.integers(1, 5000))
        yield x[i:i + n]
        i += n


@pytest.mark.parametrize("sample_rate", [3200, 8000, 2205])   # the codec's rate, and resampled
def test_encode_blocks_gives_the_codes_of_encode(codec, sample_rate, rng):
    x = make_clip(12.0, sample_rate, seed=5)   # 600 frames: several graph runs of 250
    want = codec.encode(x, sample_rate)
    seen = []
    got = codec.encode_blocks(_blocks(x, rng), sample_rate, total=len(x),
                              progress=lambda done, total: seen.append((done, total)))
    np.testing.assert_array_equal(got, want)
    assert seen[-1] == (want.shape[1], want.shape[1]) and len(seen) >= 3
    assert all(d <= t for d, t in seen)
    # guard: one changed block changes the codes, so equality is not vacuous
    y = x.copy()
    y[len(y) // 2: len(y) // 2 + 400] = 0
    assert (codec.encode_blocks(_blocks(y, rng), sample_rate) != want).any()


# Peak RSS from VmHWM, which belongs to this process's own memory; ru_maxrss would carry over
# the forked pytest parent's size across exec.
MEASURE = """
import sys
from moss_tts.cli import main
rc = main(["encode", sys.argv[1], "--codec", sys.argv[2], "-o", sys.argv[3], "--quiet",
           "--threads", "1", "--n-quantizers", "1"])
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(rc, hwm.split()[1])
"""


def _peak_rss_kib(wav, codec_gguf, out) -> int:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(wav), str(codec_gguf), str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-500:]
    rc, kib = proc.stdout.split()
    assert rc == "0"
    return int(kib)


def test_encode_cli_memory_does_not_grow_with_the_file(codec_gguf, tmp_path):
    rate, minutes = 3200, (1, 8)
    rng = np.random.default_rng(3)
    peaks = []
    for m in minutes:
        wav = tmp_path / f"{m}min.wav"
        sf.write(wav, (0.1 * rng.standard_normal(rate * 60 * m)).astype(np.float32), rate,
                 subtype="PCM_16")
        peaks.append(_peak_rss_kib(wav, codec_gguf, tmp_path / f"{m}min.npy"))
        assert np.load(tmp_path / f"{m}min.npy").shape == (1, rate * 60 * m // 64)
    # reading the 8-minute file whole would add its 7 extra minutes as float32 (5.4 MiB);
    # what may grow is the codes (4 bytes a frame, 84 KiB) and allocator noise
    extra_audio_kib = rate * 60 * (minutes[1] - minutes[0]) * 4 // 1024
    growth = peaks[1] - peaks[0]
    print(f"peak RSS {peaks[0]} KiB for {minutes[0]} min, {peaks[1]} KiB for {minutes[1]} min")
    assert growth < extra_audio_kib / 3, f"peak RSS grew {growth} KiB (audio {extra_audio_kib} KiB)"
