"""bench/delay.py at tiny dims (the script runs minutes at real dims): the random weights it
writes in upstream's published layout (bench/delay_weights.py) load through our published
loader with the types the converter's policy picks and the checkpoint's codebook count, rows
come from the pool without quantizing per tensor, the voice-clone prompt ends in audio, the
checkpoint table holds the dimensions the docstring cites, and the whole script runs for each
checkpoint."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import delay as bench
from bench import delay_weights as weights
from bench import local as bench_local
from moss_tts.ggml import GGUFFile
from moss_tts.ggml.quant import dequantize
from moss_tts.ggml.types import GGMLType
from moss_tts.models.delay_published import load_published
from moss_tts.models.delay_state import DelayState


def test_pooled_rows_are_whole_rows_of_the_type_and_differ_per_tensor():
    a, b = weights.PooledRows("a", (3000, 256)), weights.PooledRows("b", (3000, 256))
    blocks = list(a.encoded(GGMLType.Q4_K))
    assert [len(x) for x in blocks] == [1024, 1024, 952]     # pool-sized blocks of rows
    raw = np.concatenate(blocks)
    assert raw.shape == (3000, 144) and raw.dtype == np.uint8  # q4_K: 144 bytes per 256
    values = dequantize(raw, GGMLType.Q4_K, (3000, 256))
    assert 0.5 < values.std() * 16 < 1.5                     # ~ N(0, 1/256)
    assert not np.array_equal(raw, np.concatenate(list(b.encoded(GGMLType.Q4_K))))


@pytest.mark.parametrize("checkpoint", ["tts", "voicegen"])
def test_written_layout_loads_with_the_policy_types(tmp_path, checkpoint):
    args = argparse.Namespace(checkpoint=checkpoint, type="q4_K", head_type=None, tiny=True,
                              data=str(tmp_path))
    d = weights.weights_dir(args)
    assert weights.weights_dir(args) == d                  # written once, then reused
    assert not list(tmp_path.glob("*.partial"))
    with GGUFFile(next(d.glob("*.gguf"))) as f:
        types = {n: i.type for n, i in f.tensors.items()}
        assert f["general.architecture"] == "qwen3" and f["tokenizer.ggml.model"] == "gpt2"
        assert len(f["tokenizer.ggml.tokens"]) == weights.TINY_VOCAB
    # the tiny rows (64) do not fit q4_K blocks: f16; the text head q8_0 (P21)
    assert types["blk.0.ffn_up.weight"] == GGMLType.F16 and types["output.weight"] == GGMLType.Q8_0
    assert types["token_embd.weight"] == GGMLType.F16
    assert types["output_norm.weight"] == GGMLType.F32
    model = load_published(d)
    try:
        assert model.config.n_vq == {"tts": 32, "voicegen": 16}[checkpoint]
        rows = bench.voice_clone_prompt(model.config, 80)
        _, text, audio = model.forward(rows[-3:])
        assert np.isfinite(text).all() and np.isfinite(audio[:, :, :1024]).all()
    finally:
        model.close()


def test_voice_clone_prompt_has_a_reference_block_and_ends_in_audio():
    cfg = weights.config("tts", tiny=True)
    rows = bench.voice_clone_prompt(cfg, 300)
    assert rows.shape == (300, 33) and rows[-1, 0] == cfg.audio_start_token_id
    assert (rows[:, 0] == cfg.audio_user_slot_token_id).sum() > 200
    assert (rows[:, 1:] != cfg.audio_pad_code).any()
    assert DelayState.from_prompt(rows[:, 0], cfg.ids).is_audio


def test_checkpoints_have_the_released_dimensions():
    """Written from upstream's README (sizes), model cards (TTSD's NVQ 16) and Qwen3's published
    8B / 1.7B shapes; the 1.7B backbone is the one bench/local.py benches as MossTTSLocal."""
    tts, ttsd, vg = (weights.config(c, tiny=False) for c in ("tts", "ttsd", "voicegen"))
    lc = tts.language_config
    assert (lc.hidden_size, lc.num_hidden_layers, lc.num_attention_heads,
            lc.num_key_value_heads, lc.head_dim, lc.intermediate_size,
            lc.rope_theta) == (4096, 36, 32, 8, 128, 12288, 1e6)
    assert (tts.n_vq, ttsd.n_vq, vg.n_vq) == (32, 16, 16)
    assert ttsd.language_config == lc
    lc = vg.language_config
    assert (lc.hidden_size, lc.num_hidden_layers, lc.num_attention_heads,
            lc.num_key_value_heads, lc.head_dim, lc.intermediate_size,
            lc.rope_theta) == (2048, 28, 16, 8, 128, 6144, 1e6)
    assert lc == bench_local.config(tiny=False).language_config
    for cfg in (tts, ttsd, vg):
        assert cfg.vocab_size == 155648 and cfg.audio_rows == 1025


def peer_usable() -> bool:
    """llama-cpp-python is installed, built without AMX (the bench refuses an AMX build)."""
    try:
        import llama_cpp
    except ImportError:
        return False
    return b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info()


@pytest.mark.parametrize("checkpoint", ["tts", "voicegen"])
def test_tiny_bench_runs_end_to_end_for_each_checkpoint(tmp_path, checkpoint):
    """The driver and our worker in a subprocess, as a user runs it (the peer too where
    llama-cpp-python is usable: not a dependency)."""
    peer = [] if peer_usable() else ["--no-peer"]
    n_vq = weights.CHECKPOINTS[checkpoint].n_vq
    r = subprocess.run([sys.executable, "bench/delay.py", "--tiny", "--no-wait", "--checkpoint",
                        checkpoint, "--types", "q8_0", "--steps", str(n_vq + 4), "--prompt", "60",
                        "--threads", "1", "--repack", "on", "--data", str(tmp_path), *peer],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert [x["side"] for x in results] == ["ours"] + ([] if peer else ["peer"])
    for result in results:
        assert "error" not in result, result
        assert result["checkpoint"] == checkpoint
        for part in ("backbone", "heads", "sampling", "step", "prefill", "first_audio"):
            assert result[f"{part}_ms"] > 0, part
        assert result["floor_ms"] > 0 and result["peak_rss_gb"] > 0
    assert list(tmp_path.glob(f"delay{'' if checkpoint == 'tts' else '-' + checkpoint}-tiny-*"))


def test_steps_must_exceed_the_checkpoints_n_vq(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--checkpoint", "voicegen", "--tiny", "--steps", "16"])
    assert "n_vq (16)" in capsys.readouterr().err
