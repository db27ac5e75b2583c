"""bench/soundeffect_v2.py runs end to end at tiny dims (its workers in subprocesses, as the driver
runs them): every figure of the report is there and finite, and the step's GFLOP counted from the
dims equals ggml's own count of the graph. The upstream PyTorch peer needs torch, which the test
venv has not: it is exercised by the bench's own runs (`--peer-python`, docs/performance.md: its
cond velocity equals ours to 7e-6 at the real dims), as every peer of bench/ is. No time is
asserted."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import soundeffect_v2 as bench  # noqa: E402

TYPE_FIGURES = ("step_s", "single_s", "pair_over_two_singles", "short_step_s", "gflops", "of_peak",
                "ggml_gflop", "generation_30s_s", "generation_short_s", "peak_rss_gb",
                "weights_gb")


def run_bench(tmp_path, *flags) -> dict:
    r = subprocess.run([sys.executable, "bench/soundeffect_v2.py", "--tiny", "--no-wait",
                        "--threads", "1", "--data", str(tmp_path), *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (result,) = json.loads(r.stdout.strip().splitlines()[-1])
    assert not [row for row in result["rows"] if "error" in row], result["rows"]
    return result["summary"]


def test_tiny_bench_reports_every_figure(tmp_path):
    out = tmp_path / "results.json"
    s = run_bench(tmp_path, "--no-peer", "--types", "f32,f16,q8_0", "--json", str(out))
    assert sorted(s["types"]) == ["f16", "f32", "q8_0"]
    for t, figures in s["types"].items():
        for name in TYPE_FIGURES:
            assert math.isfinite(figures[name]) and figures[name] > 0, (t, name)
        assert figures["finite"], t
        # the rate is the dims' count over the time; ggml counted the same graph
        assert figures["ggml_gflop"] == pytest.approx(s["gflop_measured"], rel=1e-9), t
    for name in ("gflop_step", "gflop_short", "peak", "vae_s", "vae_short_s"):
        assert math.isfinite(s[name]) and s[name] > 0, name
    assert math.isnan(s["upstream_step_s"])                  # --no-peer
    assert json.loads(out.read_text())["summary"]["types"].keys() == s["types"].keys()


def test_tensor_values_are_keyed_by_name():
    a = bench.tensor_value("blocks.0.ffn.0.weight", (6, 4))
    assert np.array_equal(a, bench.tensor_value("blocks.0.ffn.0.weight", (6, 4)))
    assert not np.array_equal(a, bench.tensor_value("blocks.1.ffn.0.weight", (6, 4)))
    gain = bench.tensor_value("blocks.0.norm3.weight", (64,))
    assert np.all(np.abs(gain - 1.0) < 0.6) and a.dtype == gain.dtype == np.float32


def test_step_gflop_scales_with_batch_and_frames():
    cfg = bench.REAL_DIT
    pair, single = bench.step_gflop(cfg, 1500, 512, 2), bench.step_gflop(cfg, 1500, 512, 1)
    assert pair == pytest.approx(2 * single)
    # the 1.3B preset at 30 s: ~8.9 TFLOP per CFG pair; 5 s costs ~1/5.5 of it, not 1/6: the
    # text MLP and the cross-attention k/v over the 512 context rows do not shrink with frames
    assert 8800 < pair < 9000
    assert 5.2 < pair / bench.step_gflop(cfg, 250, 512, 2) < 5.8
