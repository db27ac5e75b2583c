"""bench/delay.py's pieces at tiny dims (the script itself runs minutes at real dims): the
random weights it writes in upstream's published layout load through our published loader with
the types the converter's policy picks, rows come from the pool without quantizing per tensor,
and the voice-clone prompt ends in audio."""

import argparse

import numpy as np

from bench import delay as bench
from moss_tts.ggml import GGUFFile
from moss_tts.ggml.quant import dequantize
from moss_tts.ggml.types import GGMLType
from moss_tts.models.delay_published import load_published
from moss_tts.models.delay_state import DelayState


def test_pooled_rows_are_whole_rows_of_the_type_and_differ_per_tensor():
    a, b = bench.PooledRows("a", (3000, 256)), bench.PooledRows("b", (3000, 256))
    blocks = list(a.encoded(GGMLType.Q4_K))
    assert [len(x) for x in blocks] == [1024, 1024, 952]     # pool-sized blocks of rows
    raw = np.concatenate(blocks)
    assert raw.shape == (3000, 144) and raw.dtype == np.uint8  # q4_K: 144 bytes per 256
    values = dequantize(raw, GGMLType.Q4_K, (3000, 256))
    assert 0.5 < values.std() * 16 < 1.5                     # ~ N(0, 1/256)
    assert not np.array_equal(raw, np.concatenate(list(b.encoded(GGMLType.Q4_K))))


def test_written_layout_loads_with_the_policy_types(tmp_path):
    args = argparse.Namespace(type="q4_K", head_type=None, tiny=True, data=str(tmp_path))
    d = bench.weights_dir(args)
    assert bench.weights_dir(args) == d                    # written once, then reused
    assert not list(tmp_path.glob("*.partial"))
    with GGUFFile(next(d.glob("*.gguf"))) as f:
        types = {n: i.type for n, i in f.tensors.items()}
        assert f["general.architecture"] == "qwen3" and f["tokenizer.ggml.model"] == "gpt2"
        assert len(f["tokenizer.ggml.tokens"]) == bench.config(True).vocab_size
    # the tiny rows (64) do not fit q4_K blocks: f16; the text head q8_0 (P21)
    assert types["blk.0.ffn_up.weight"] == GGMLType.F16 and types["output.weight"] == GGMLType.Q8_0
    assert types["token_embd.weight"] == GGMLType.F16
    assert types["output_norm.weight"] == GGMLType.F32
    model = load_published(d)
    try:
        rows = bench.voice_clone_prompt(model.config, 80)
        _, text, audio = model.forward(rows[-3:])
        assert np.isfinite(text).all() and np.isfinite(audio[:, :, :1024]).all()
    finally:
        model.close()


def test_voice_clone_prompt_has_a_reference_block_and_ends_in_audio():
    cfg = bench.config(True)
    rows = bench.voice_clone_prompt(cfg, 300)
    assert rows.shape == (300, 33) and rows[-1, 0] == cfg.audio_start_token_id
    assert (rows[:, 0] == cfg.audio_user_slot_token_id).sum() > 200
    assert (rows[:, 1:] != cfg.audio_pad_code).any()
    assert DelayState.from_prompt(rows[:, 0], cfg.ids).is_audio
