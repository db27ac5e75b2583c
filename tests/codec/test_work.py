"""The work a codec decode asks ggml for (moss_tts.ggml.count_flops, which the benches divide by
time for GFLOP/s), against a count written from the tiny checkpoint's config.json alone."""

import numpy as np

from fixtures.make_codec import load_config
from moss_tts.ggml import count_flops


def _decoder_count(config: dict, frames: int, chunk_frames: int):
    """(linear flops, least and most attention flops) of decoding `frames` code frames from a
    fresh state: every Linear is 2·in·out per position; attention is q·kᵀ and p·v, 4·d per
    query and key, over at least the keys each query may see (its causal window) and at most
    the slots of a ring cache sized for the window plus a whole chunk, padded to 32."""
    frame_rate = config["sample_rate"] / config["downsample_rate"]
    q = config["quantizer_kwargs"]
    linear = 2 * q["rvq_dim"] * q["output_dim"] * frames          # the quantizer's output_proj
    least = most = 0
    per_frame = 1
    for m in config["decoder_kwargs"]:
        if m["module_type"] == "PatchedPretransform":
            per_frame *= m["patch_size"]
            continue
        t, d, ffn = frames * per_frame, m["d_model"], m["dim_feedforward"]
        proj = (m["input_dimension"] * d if m["input_dimension"] != d else 0) \
            + (m["output_dimension"] * d if m["output_dimension"] != d else 0)
        linear += 2 * t * (proj + m["num_layers"] * (4 * d * d + 2 * d * ffn))
        window = round(config["causal_transformer_context_duration"] * frame_rate * per_frame)
        seen = sum(min(p + 1, window) for p in range(t))
        least += m["num_layers"] * 4 * d * seen
        most += m["num_layers"] * 4 * d * t * (window + chunk_frames * per_frame + 32)
    return linear, least, most


def test_a_decode_counts_the_linears_of_the_config_and_at_least_each_window(codec, tiny_checkpoint):
    config = load_config(tiny_checkpoint)
    frames = codec.chunk_frames // 2                               # one graph run
    codes = np.random.default_rng(3).integers(0, codec.config.codebook_size,
                                              (codec.n_quantizers, frames))
    linear, least, most = _decoder_count(config, frames, codec.chunk_frames)
    with count_flops() as work:
        codec.decode(codes)
    assert work.runs == 1
    assert work.mul_mat == linear
    assert least <= work.flash_attn <= most


def test_two_decodes_count_twice(codec):
    codes = np.zeros((codec.n_quantizers, 10), np.int32)
    with count_flops() as one:
        codec.decode(codes)
    with count_flops() as two:
        codec.decode(codes)
        codec.decode(codes)
    assert two.total == 2 * one.total > 0


def test_the_codec_bench_splits_both_towers_by_stage_and_chains_to_the_runners_result(
        codec, codec_gguf, clip, tmp_path, monkeypatch):
    """bench/codec.py --worker stages on the tiny codec: one graph per stage, chained through
    the host, gives the runner's codes and audio; its per-stage GFLOP (the useful work: each
    query's causal window) adds up to no more than what the graphs were given."""
    import argparse

    from bench import codec as bench_codec

    monkeypatch.setattr(bench_codec, "WORK", tmp_path)
    monkeypatch.setattr(bench_codec, "gguf_path", lambda outtype: codec_gguf)
    monkeypatch.setattr(bench_codec, "SAMPLE_RATE", codec.sample_rate)
    np.save(tmp_path / "audio.npy", clip)
    frames = len(clip) // codec.downsample_rate
    np.save(tmp_path / "codes.npy", np.random.default_rng(5).integers(
        0, codec.config.codebook_size, (codec.n_quantizers, frames)).astype(np.int32))
    for tower in ("encoder", "decoder"):
        args = argparse.Namespace(type="f32", threads=1, chunk=1.0, runs=1, tower=tower)
        with count_flops() as work:
            r = bench_codec.worker_stages(args)
        assert "error" not in r, r
        n_stages = sum(1 for s in getattr(codec.config, tower) if s.kind == 1)
        assert len(r["names"]) == n_stages + 2 and len(r["stage_ms"]) == len(r["names"])
        if tower == "encoder":
            assert r["match"] == 1.0                            # codes equal: all of them
        else:
            assert r["match"] < 1e-6                            # audio max|d|/RMS
        assert 0 < sum(g for g in r["gflop"] if g) * 1e9 <= work.total
