"""moss_tts/codec/codec.py: encode / decode / partial decode of the tiny v1 codec against the
float64 numpy reference (fixtures/reference/codec.py), the sliding window past its length,
resampling, stereo down-mix, and chunk-size independence (docs/upstream-notes.md §codecs-1-2, design
§5)."""

import numpy as np
import pytest
from scipy.signal import resample_poly

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import codec as ref
from moss_tts.codec import Codec

from .conftest import THREADS, make_clip, run_isolated

# A code is a near tie when its best and second-best LFQ distances are this close: float32 vs
# float64 may then legitimately pick the other entry (and the rest of that frame's residual
# chain follows). Distances live on the unit sphere, in [0, 4].
NEAR_TIE = 1e-4
# f32 graph vs float64 reference through four decoder transformer stages (dot products of ≤ 64
# terms, 5 layers); the output peaks near 18, so f32 rounding (6e-8 relative) accumulates to a
# few 1e-6. Measured 2.9e-6 on the 3 s clip.
DECODE_ATOL = 2e-5
# The same f32 graph run with different chunkings: only the softmax/matmul summation order
# changes (more or fewer masked keys). Measured 2.9e-6 (3 s), 3.8e-6 (60 s).
CHUNK_ATOL = 1e-5


def assert_codes_match(got, want, margins):
    """Codes equal the reference, except that in a frame the first codebook where they differ
    may be a near tie (everything after it in that frame follows another residual)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.size > 0, (got.shape, want.shape)
    differs = got != want
    for t in np.flatnonzero(differs.any(axis=0)):
        q = int(np.argmax(differs[:, t]))
        assert margins[q, t] < NEAR_TIE, (
            f"frame {t}, codebook {q}: got {got[q, t]}, reference {want[q, t]}, but the "
            f"reference's margin {margins[q, t]:.3g} is no near tie")
    return float(differs.mean())


@pytest.fixture(scope="module")
def reference_codes(reference_model, clip):
    state, config = reference_model
    return ref.encode_with_margins(state, config, clip)


@pytest.fixture(scope="module")
def codes(codec, clip):
    return codec.encode(clip, codec.sample_rate)


def reference_decode_with_context(state, config, codes, *, stage, delta):
    """The reference decoder built stage by stage, with decoder stage `stage`'s window changed
    by `delta` frames (delta 0 is exactly ref.decode)."""
    cfg = ref.codec_config(config)
    cfg["decoder"][stage]["context"] += delta
    x = ref.dequantize(codes, ref.quantizer_weights(state, cfg))
    for s in cfg["decoder"]:
        x = ref.run_stage(x, state, s)
    return x[:, 0].astype(np.float32)


# -- encode -----------------------------------------------------------------------------------


def test_encode_matches_reference_codes(codec, codes, reference_codes):
    want, margins = reference_codes
    assert codes.dtype == np.int32
    assert codes.shape == (codec.n_quantizers, 150)
    # non-vacuous: nearly all codes are decisive, and the codes are not a constant
    assert (margins >= NEAR_TIE).mean() >= 0.95, (margins < NEAR_TIE).mean()
    assert len(np.unique(want)) > 32
    assert_codes_match(codes, want, margins)


def test_encode_with_fewer_codebooks_is_the_prefix_of_full_encode(codec, clip, codes):
    for k in (1, 3):
        assert np.array_equal(codec.encode(clip, codec.sample_rate, n_quantizers=k), codes[:k])


def test_encode_is_causal_code_frame_depends_only_on_samples_up_to_its_end(codec, clip, codes):
    ds = codec.downsample_rate
    changed = clip.copy()
    changed[60 * ds:61 * ds] *= -1.0  # flip frame 60
    got = codec.encode(changed, codec.sample_rate)
    assert np.array_equal(got[:, :60], codes[:, :60])
    assert not np.array_equal(got[:, 60], codes[:, 60])  # sensitivity guard


def test_encode_drops_trailing_partial_frame(codec, clip, codes):
    ds = codec.downsample_rate
    got = codec.encode(clip[: 100 * ds + ds - 1], codec.sample_rate)
    assert np.array_equal(got, codes[:, :100])


# -- decode -----------------------------------------------------------------------------------


def test_decode_matches_reference(codec, reference_model, codes):
    state, config = reference_model
    got = codec.decode(codes)
    assert got.dtype == np.float32 and got.shape == (150 * codec.downsample_rate, 1)
    want = ref.decode(state, config, codes)
    assert_close(got[:, 0], want, atol=DECODE_ATOL, what="decode")
    # sensitivity guard: one changed code moves the result past the tolerance
    wrong = codes.copy()
    wrong[0, 75] = (wrong[0, 75] + 1) % codec.config.codebook_size
    assert_differs(codec.decode(wrong)[:, 0], want, atol=DECODE_ATOL, what="one code changed")


@pytest.mark.parametrize("k", [1, 3, 7])
def test_partial_decode_equals_decode_of_first_k_and_matches_reference(codec, reference_model,
                                                                        codes, k):
    state, config = reference_model
    got = codec.decode(codes, n_quantizers=k)
    assert_close(got, codec.decode(codes[:k]), atol=0.0, what=f"n_quantizers={k} vs codes[:{k}]")
    assert_close(got[:, 0], ref.decode(state, config, codes, n_quantizers=k), atol=DECODE_ATOL,
                 what=f"partial decode k={k}")
    # sensitivity guard: the next codebook is not silently included or ignored
    assert_differs(got, codec.decode(codes[:k + 1]), atol=DECODE_ATOL, what=f"k={k} vs k+1")


def test_sliding_window_matches_reference_past_every_window(codec, reference_model, codes):
    """3 s = 150 code frames; the decoder stages see 150/300/600 positions against windows of
    25/50/100, so every stage runs with a full, sliding window."""
    state, config = reference_model
    for s in ref.codec_config(config)["decoder"]:
        if s["kind"] == "transformer":
            assert codes.shape[1] * s["rate_in"] / codec.config.frame_rate > 2 * s["context"]
    want = ref.decode(state, config, codes)
    assert_close(reference_decode_with_context(state, config, codes, stage=4, delta=0), want,
                 atol=0.0, what="stage-by-stage reference")
    assert_close(codec.decode(codes)[:, 0], want, atol=DECODE_ATOL, what="decode past the window")
    # sensitivity guard: a window one frame shorter or longer in any stage — in particular the
    # last one — changes the decode beyond the tolerance, so the match above pins the window
    for stage in (0, 2, 4):
        for delta in (-1, 1):
            other = reference_decode_with_context(state, config, codes, stage=stage, delta=delta)
            assert_differs(other, want, atol=DECODE_ATOL,
                           what=f"decoder.{stage} context {delta:+d}")


def test_reconstruct_is_decode_of_encode(codec, clip, codes):
    assert_close(codec.reconstruct(clip, codec.sample_rate), codec.decode(codes), atol=0.0,
                 what="reconstruct")


# -- input handling -----------------------------------------------------------------------------


def test_encode_at_another_rate_equals_encoding_the_scipy_resampled_signal(codec):
    x = make_clip(3.0, 4800, seed=5)                        # 14400 samples at 4800 Hz
    resampled = resample_poly(x, 2, 3).astype(np.float32)   # 4800 → 3200 Hz: ×2/3
    got = codec.encode(x, 4800)
    assert got.shape == (codec.n_quantizers, 150)
    assert np.array_equal(got, codec.encode(resampled, codec.sample_rate))
    # sensitivity guard: the rate is not ignored
    assert not np.array_equal(got, codec.encode(x[: resampled.shape[0]], codec.sample_rate))


def test_stereo_input_to_mono_codec_is_the_channel_mean(codec, clip, codes):
    right = make_clip(3.0, codec.sample_rate, seed=12)
    stereo = np.stack([clip, right], axis=1)
    mean = ((clip + right) / 2).astype(np.float32)
    got = codec.encode(stereo, codec.sample_rate)
    assert np.array_equal(got, codec.encode(mean, codec.sample_rate))
    assert not np.array_equal(got, codes)  # sensitivity guard: not just the left channel
    # a [n, 1] input is the same as [n]
    assert np.array_equal(codec.encode(clip[:, None], codec.sample_rate), codes)


# -- chunk size -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def codecs_by_chunk(codec_gguf):
    """Codecs whose graphs run 5, 100 and 5000 code frames at a time (0.1 s, 2 s, 100 s)."""
    loaded = {s: Codec.load(codec_gguf, chunk_seconds=s, threads=THREADS)
              for s in (0.1, 2.0, 100.0)}
    yield loaded
    for c in loaded.values():
        c.close()


def test_chunk_size_does_not_change_results(codecs_by_chunk, clip, codes):
    decoded = codecs_by_chunk[2.0].decode(codes)
    for seconds, c in codecs_by_chunk.items():
        assert c.chunk_frames == round(seconds * c.config.frame_rate)
        assert np.array_equal(c.encode(clip, c.sample_rate), codes), f"chunk {seconds} s"
        assert_close(c.decode(codes), decoded, atol=CHUNK_ATOL, what=f"decode, chunk {seconds} s")


def test_long_input_runs_and_is_chunk_size_independent(codec_gguf, codecs_by_chunk):
    """60 s = 3000 code frames, 12000 positions at the 200 Hz stages (no numpy reference: slow)."""
    x = make_clip(60.0, 3200, seed=3)
    a = codecs_by_chunk[2.0]
    b = Codec.load(codec_gguf, chunk_seconds=0.7, threads=THREADS)  # 35-frame chunks
    try:
        codes = a.encode(x, 3200)
        assert codes.shape == (a.n_quantizers, 3000)
        assert np.array_equal(b.encode(x, 3200), codes)
        y = a.decode(codes)
        assert y.shape == (3000 * a.downsample_rate, 1)
        assert_close(b.decode(codes), y, atol=CHUNK_ATOL, what="60 s decode, 0.7 s vs 2 s chunks")
        # causality across many chunks: the first 3 s of the long run equal a 3 s run
        head = 150 * a.downsample_rate
        assert np.array_equal(a.encode(x[:head], 3200), codes[:, :150])
        assert_close(y[:head], a.decode(codes[:, :150]), atol=CHUNK_ATOL, what="60 s head")
    finally:
        b.close()


def test_thread_count_does_not_change_results(codec_gguf, clip, codes):
    with Codec.load(codec_gguf, threads=2, chunk_seconds=2.0) as c:
        assert np.array_equal(c.encode(clip, c.sample_rate), codes)
        decoded = c.decode(codes)
    with Codec.load(codec_gguf, threads=THREADS, chunk_seconds=2.0) as c:
        assert_close(decoded, c.decode(codes), atol=CHUNK_ATOL, what="2 threads vs 1")


# -- graphs of several sizes on one codec ---------------------------------------------------------


def check_shorter_input_after_longer_input(gguf):
    """Each tower keeps one graph per chunk length on one compute allocator; a longer input
    grows the allocator, and the shorter graph built before must still run correctly."""
    with Codec.load(gguf, threads=THREADS) as codec:
        clip = make_clip(0.2, codec.sample_rate, seed=4)            # 10 code frames
        codes = codec.encode(clip[:64], codec.sample_rate)          # 1 frame
        short = codec.decode(codes)
        codec.encode(clip, codec.sample_rate)                       # 10 frames: grows the allocator
        codec.decode(np.tile(codes, (1, 10)))
        assert np.array_equal(codec.encode(clip[:64], codec.sample_rate), codes)
        assert_close(codec.decode(codes), short, atol=0.0, what="1-frame decode replayed")


def test_shorter_input_after_longer_input_gives_the_same_result(codec_gguf):
    run_isolated(check_shorter_input_after_longer_input, codec_gguf)
