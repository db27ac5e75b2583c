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
