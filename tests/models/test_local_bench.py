"""bench/local.py's pieces at tiny dims (the script runs minutes at real dims): the random
weights it writes load as a Local GGUF with the converter's type policy, the floor counts the
depth stack once per depth position, the prompt ends in audio, and a worker run reports every
part of a frame."""

import argparse

import numpy as np

from bench import local as bench
from moss_tts.ggml import GGUFFile, Weights, get_backend
from moss_tts.ggml.types import GGMLType
from moss_tts.models.local import LocalModel


def args_for(tmp_path, outtype="q8_0", **kw):
    return argparse.Namespace(type=outtype, tiny=True, data=str(tmp_path), threads=1,
                              frames=5, prompt=30, **kw)


def test_written_weights_load_as_a_local_gguf_with_the_policy_types(tmp_path):
    path = bench.weights_file(args_for(tmp_path))
    assert bench.weights_file(args_for(tmp_path)) == path     # written once, then reused
    with GGUFFile(path) as f:
        types = {n: i.type for n, i in f.tensors.items()}
    # tiny widths of 64 are whole q8_0 blocks; the heads q8_0, the tables f32 (design §4)
    assert types["blk.0.ffn_up.weight"] == GGMLType.Q8_0 == types["output.weight"]
    assert types["token_embd.weight"] == GGMLType.F32 == types["embedding_list.3.weight"]
    assert types["local.blk.0.ffn_down.weight"] == GGMLType.Q8_0       # rows of 96
    assert types["local.blk.0.attn_q.weight"] == GGMLType.F16          # rows of 48
    model = LocalModel(Weights.load(path, get_backend(None, 1)))
    try:
        assert model.config == bench.config(True)
    finally:
        model.close()


def test_floor_reads_the_depth_stack_once_per_position(tmp_path):
    path = bench.weights_file(args_for(tmp_path, "f16"))
    cfg = bench.config(True)
    parts = bench.frame_bytes(path, cfg, 10)
    with GGUFFile(path) as f:
        local = sum(i.nbytes for n, i in f.tensors.items() if n.startswith("local."))
    assert parts["depth"] > (cfg.n_vq + 1) * local
    with GGUFFile(path) as f:
        assert parts["heads"] == sum(f.tensors[n].nbytes for n in f.tensors
                                     if n.startswith("lm_heads.") or n == "output.weight")


def test_prompt_is_a_voice_clone_ending_in_audio():
    cfg = bench.config(True)
    rows = bench.voice_clone_prompt(cfg, 40)
    assert rows.shape == (40, cfg.n_vq + 1) and rows[-1, 0] == cfg.audio_start_token_id
    slots = rows[:, 0] == cfg.audio_user_slot_token_id
    assert slots.sum() == 16 and (rows[slots, 1:] < cfg.audio_vocab_size).all()
    assert (rows[~slots, 1:] == cfg.audio_pad_code).all()


def test_worker_reports_every_part_of_a_frame(tmp_path):
    out = bench.run_ours(args_for(tmp_path))
    for part in ("backbone", "depth", "heads", "sampling", "python", "frame", "prefill",
                 "first_audio"):
        assert np.isfinite(out[f"{part}_ms"]), part
    assert out["frame_ms"] > 0 and out["first_audio_ms"] > out["prefill_ms"]
