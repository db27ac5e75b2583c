"""bench/local_v15.py runs end to end at tiny dims (its worker in a subprocess, as the driver
runs it): every part of a frame is timed, the floor is computed from the written file, and the
local block counts once per position."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_bench_times_every_part_of_a_frame(tmp_path):
    r = subprocess.run([sys.executable, "bench/local_v15.py", "--tiny", "--no-wait", "--types",
                        "q8_0", "--frames", "8", "--prompt", "16", "--threads", "1", "--data",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (result,) = json.loads(r.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    for part in ("backbone", "local", "heads", "sampling", "python", "frame", "prefill",
                 "first_chunk"):
        assert result[f"{part}_ms"] > 0, part
    assert result["floor_ms"] > 0 and result["peak_rss_gb"] > 0


def test_frame_bytes_read_the_local_block_once_per_position(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench import local_v15 as bench

    args = type("A", (), {"tiny": True, "data": str(tmp_path), "embed_type": "f32"})()
    path = bench.model_path(args, "f16")
    cfg = bench.config(True)
    parts = bench.frame_bytes(path, cfg, n_past=0)
    # f16 matrices (c_attn, c_proj, fc_in, fc_out); f32 biases and ln_1, ln_2, ln_f
    local = 2 * (3 * 64 * 64 + 64 * 64 + 2 * 64 * 96) + 4 * (3 * 64 + 64 + 96 + 64 + 6 * 64)
    assert parts["local"] == cfg.n_vq * local
    assert parts["heads"] == 4 * 64 * (cfg.n_vq * cfg.audio_vocab_size + 2)
