"""bench/codec_stream.py runs end to end on the tiny codecs (its workers in subprocesses, as the
driver runs them): a retyped GGUF has the linears in the type and everything else as the f32
one, every figure of the report is there and finite, f32's distance to itself is 0 and a
lighter type's is not, and the log-mel distance is 0 for equal audio and grows with noise. No
time is asserted."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import codec_stream as bench  # noqa: E402
from moss_tts.ggml import GGMLType, GGUFFile  # noqa: E402


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_the_bench_reports_every_type(tiny_codec, tmp_path, variant):
    f32 = tmp_path / "codec-f32.gguf"
    shutil.copy(tiny_codec(variant), f32)
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "bench/codec_stream.py", "--codec", str(f32),
                        "--types", "f32,q8_0", "--pushes", "1,2", "--frames", "40",
                        "--threads", "1", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "push 2: ms/frame (RTF)" in r.stdout and "log-mel dB" in r.stdout
    assert "per decoder stage" in r.stdout
    res = json.loads(out.read_text())["results"]
    assert set(res) == {"f32", "q8_0"}
    for figures in res.values():
        for push in figures["pushes"].values():
            assert all(np.isfinite(v) and v > 0 for v in push.values())
        assert figures["offline_ms_per_frame"] > 0 and figures["floor_ms"] > 0
        stages = figures["stages"]
        assert stages and all(st["mib"] > 0 and st["gflop"] > 0 for st in stages)
        assert sum(st["mib"] for st in stages) <= figures["decoder_mib"]
    assert res["f32"]["error"] == {"max_rel": 0.0, "rms_rel": 0.0, "log_mel_db": 0.0}
    assert 0 < res["q8_0"]["error"]["rms_rel"] < 0.05
    assert res["q8_0"]["decoder_mib"] < res["f32"]["decoder_mib"]
    with GGUFFile(f32) as a, GGUFFile(tmp_path / "codec-q8_0.gguf") as b:
        assert set(a.tensors) == set(b.tensors) and set(a.keys()) == set(b.keys())
        changed = {n for n in a.tensors if a.tensors[n].type != b.tensors[n].type}
        assert {n.split(".")[0] for n in changed} == {"encoder", "decoder"}
        assert {b.tensors[n].type for n in changed} <= {GGMLType.Q8_0, GGMLType.F16}


def test_log_mel_distance_is_zero_for_equal_audio_and_grows_with_noise():
    sr = 24000
    t = np.arange(sr) / sr
    x = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[:, None]
    noise = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    assert bench.distances(x, x, sr)["log_mel_db"] == 0.0
    small = bench.distances(x + 1e-3 * noise, x, sr)
    large = bench.distances(x + 1e-1 * noise, x, sr)
    assert 0 < small["log_mel_db"] < large["log_mel_db"]
    assert small["rms_rel"] == pytest.approx(1e-3 / np.sqrt(np.mean(x ** 2)), rel=0.05)
