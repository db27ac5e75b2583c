"""moss_tts/codec/codec.py on the 48 kHz-family stereo codecs (MOSS-Audio-Tokenizer-Nano and -v2
structure, tiny): encode / decode / partial decode against the float64 numpy reference
(fixtures/reference/codec.py), the L R sample interleave and its inverse, mono and channel
handling, resampling, streaming and chunk-size independence (docs/upstream-notes.md §codecs-1.8,
§codecs-3, §codecs-4).

The tiny codecs run at 1600 Hz per channel, 32 samples per channel per code frame (50 Hz); the
towers see one interleaved L0 R0 L1 R1 … stream at 3200 Hz."""

from types import SimpleNamespace

import math

import numpy as np
import pytest
from scipy.signal import resample_poly

from fixtures.compare import assert_close, assert_differs
from fixtures.make_codec import load_config, load_state
from fixtures.reference import codec as ref
from moss_tts.audio import resample
from moss_tts.codec import Codec
from moss_tts.codec.codec import default_chunk_seconds
from moss_tts.errors import InputError

from .conftest import CLIP_SECONDS, THREADS, make_clip, run_isolated
from .test_codec import NEAR_TIE, assert_codes_match
from .test_streaming import irregular, push_all

VARIANTS = ("nano", "v2")
N_FRAMES = 150  # CLIP_SECONDS (3 s) at 50 Hz: past the window of every stage of both towers
# f32 graph vs float64 reference through the decoder transformer stages (dot products of ≤ 64
# terms); the output peaks near 18, so f32 rounding (6e-8 relative) accumulates to a few 1e-6.
# Measured 2.9e-6 (Nano) and 2.9e-6 (v2) on the 3 s clip, the same as the mono v1 codec.
DECODE_ATOL = 2e-5
# The same f32 graph with different chunkings: only the summation order inside softmax and the
# matmuls changes (more or fewer masked keys or cache slots). v1 measured ≤ 4e-6.
CHUNK_ATOL = 1e-5
# irregular includes a chunk longer than the codec's 100-frame graph chunk
CHUNKINGS = {"one_frame": "1", "irregular": "1,3,7,2,11,5,104"}


@pytest.fixture(scope="session", params=VARIANTS)
def stereo(request, tiny_codec):
    """Per variant: the tiny checkpoint converted once (strict: tiny_codec) and loaded through
    the real loader, plus the reference's (state, config.json)."""
    name = request.param
    gguf = tiny_codec(name)
    ckpt = gguf.parent / "hf"     # the checkpoint beside its GGUF (fixtures.make_codec)
    codec = Codec.load(gguf, threads=THREADS)
    # the largest graphs first, as the shared v1 codec does (conftest.codec)
    codec.decode(np.zeros((codec.n_quantizers, codec.chunk_frames), np.int32))
    codec.encode(np.zeros((codec.chunk_frames * codec.downsample_rate, 2), np.float32),
                 codec.sample_rate)
    yield SimpleNamespace(name=name, gguf=gguf, codec=codec, state=load_state(ckpt),
                          config=load_config(ckpt))
    codec.close()


@pytest.fixture(scope="session")
def stereo_clip(stereo):
    """(n, 2) time-major: two different signals (the right one is another clip, time-reversed)."""
    sr = stereo.codec.sample_rate
    left = make_clip(CLIP_SECONDS, sr, seed=11)
    right = make_clip(CLIP_SECONDS, sr, seed=12)[::-1]
    return np.ascontiguousarray(np.stack([left, right], axis=1))


@pytest.fixture(scope="session")
def reference_codes(stereo, stereo_clip):
    return ref.encode_with_margins(stereo.state, stereo.config, stereo_clip)


@pytest.fixture(scope="session")
def codes(stereo, stereo_clip):
    return stereo.codec.encode(stereo_clip, stereo.codec.sample_rate)


@pytest.fixture(scope="session")
def reference_audio(stereo, codes):
    return ref.decode(stereo.state, stereo.config, codes)


def one_line(excinfo):
    msg = str(excinfo.value)
    assert msg and "\n" not in msg, msg
    return msg


def reference_decode_with_context(state, config, codes, *, stage, delta):
    """The reference decoder built stage by stage, with decoder stage `stage`'s window changed
    by `delta` frames, then de-interleaved (delta 0 is exactly ref.decode)."""
    cfg = ref.codec_config(config)
    cfg["decoder"][stage]["context"] += delta
    x = ref.dequantize(codes, ref.quantizer_weights(state, cfg))
    for s in cfg["decoder"]:
        x = ref.run_stage(x, state, s)
    return ref.deinterleave_channels(x[:, 0], 2).astype(np.float32)


# -- encode -----------------------------------------------------------------------------------


def test_encode_stereo_matches_reference_codes(stereo, stereo_clip, codes, reference_codes):
    want, margins = reference_codes
    c = stereo.codec
    assert (c.channels, c.sample_rate, c.downsample_rate) == (2, 1600, 32)
    assert c.config.stream_samples_per_frame == 64
    left, right = stereo_clip.T
    assert np.abs(left - right).max() > 0.5  # the two channels carry different signals
    assert codes.dtype == np.int32 and codes.shape == (c.n_quantizers, N_FRAMES)
    # non-vacuous: nearly all codes are decisive, and the codes are not a constant
    assert (margins >= NEAR_TIE).mean() >= 0.95, (margins < NEAR_TIE).mean()
    assert len(np.unique(want)) > 32
    assert_codes_match(codes, want, margins)


def test_swapping_left_and_right_changes_the_codes_as_the_reference_does(stereo, stereo_clip,
                                                                         codes):
    swapped = np.ascontiguousarray(stereo_clip[:, ::-1])
    got = stereo.codec.encode(swapped, stereo.codec.sample_rate)
    assert_codes_match(got, *ref.encode_with_margins(stereo.state, stereo.config, swapped))
    assert (got != codes).mean() > 0.3  # a channel swap bug must fail the test above


def test_encode_interleaves_samples_not_channels(stereo, stereo_clip, codes):
    """The stream is L0 R0 L1 R1 … (docs/upstream-notes.md §codecs-1.8): the same samples fed so
    that the stream reads L0 L1 … R0 R1 … (np.concatenate of the two channels) give other codes, and
    a channel-major (Fortran-ordered) array is read by index, not by memory order."""
    left, right = stereo_clip.T
    assert np.array_equal(ref.interleave_channels(stereo_clip)[0::2], left)
    channel_major_stream = np.concatenate([left, right]).reshape(-1, 2)
    sr = stereo.codec.sample_rate
    assert (stereo.codec.encode(channel_major_stream, sr) != codes).mean() > 0.3
    fortran = np.asfortranarray(stereo_clip)
    assert not fortran.flags.c_contiguous
    assert np.array_equal(stereo.codec.encode(fortran, sr), codes)


def test_encode_drops_trailing_partial_frame_per_channel(stereo, stereo_clip, codes):
    ds = stereo.codec.downsample_rate  # per channel
    got = stereo.codec.encode(stereo_clip[: 100 * ds + ds - 1], stereo.codec.sample_rate)
    assert np.array_equal(got, codes[:, :100])


def test_mono_input_is_duplicated_to_both_channels(stereo, stereo_clip, codes):
    c = stereo.codec
    mono = stereo_clip[:, 0]
    dup = c.encode(np.stack([mono, mono], axis=1), c.sample_rate)
    assert np.array_equal(c.encode(mono, c.sample_rate), dup)
    assert np.array_equal(c.encode(mono[:, None], c.sample_rate), dup)
    assert_codes_match(dup, *ref.encode_with_margins(stereo.state, stereo.config, mono))
    assert not np.array_equal(dup, codes)  # sensitivity guard: the right channel matters


def test_three_channels_are_rejected_with_one_line(stereo, stereo_clip):
    three = np.concatenate([stereo_clip, stereo_clip[:, :1]], axis=1)
    with pytest.raises(InputError) as e:
        stereo.codec.encode(three, stereo.codec.sample_rate)
    assert "3 channels" in one_line(e)


def test_encode_at_twice_the_rate_equals_encoding_the_scipy_resampled_signal(stereo):
    c = stereo.codec
    x = np.stack([make_clip(CLIP_SECONDS, 2 * c.sample_rate, seed=5),
                  make_clip(CLIP_SECONDS, 2 * c.sample_rate, seed=6)[::-1]], axis=1)
    # each channel on its own: the codec must resample along time, per channel
    resampled = np.stack([resample_poly(x[:, ch], 1, 2) for ch in range(2)],
                         axis=1).astype(np.float32)
    got = c.encode(x, 2 * c.sample_rate)
    assert got.shape == (c.n_quantizers, N_FRAMES)
    assert np.array_equal(got, c.encode(resampled, c.sample_rate))
    # sensitivity guard: the rate is not ignored
    assert not np.array_equal(got, c.encode(x[: resampled.shape[0]], c.sample_rate))


# -- decode -----------------------------------------------------------------------------------


def test_decode_stereo_matches_reference_channel_by_channel(stereo, codes, reference_audio):
    c = stereo.codec
    got = c.decode(codes)
    assert got.dtype == np.float32 and got.shape == (N_FRAMES * c.downsample_rate, 2)
    assert reference_audio.shape == got.shape
    assert_close(got, reference_audio, atol=DECODE_ATOL, what="stereo decode")
    # the de-interleave, channel by channel: left = even stream samples, right = odd
    for ch, side in enumerate(("left", "right")):
        assert_close(got[:, ch], reference_audio[:, ch], atol=DECODE_ATOL, what=side)
    # sensitivity guards: swapped output channels, and one changed code, are caught
    assert_differs(got[:, ::-1], reference_audio, atol=DECODE_ATOL, what="channels swapped")
    wrong = codes.copy()
    wrong[0, 75] = (wrong[0, 75] + 1) % c.config.codebook_size
    assert_differs(c.decode(wrong), reference_audio, atol=DECODE_ATOL, what="one code changed")


def test_swapped_input_decodes_differently(stereo, stereo_clip, codes, reference_audio):
    swapped = stereo.codec.encode(np.ascontiguousarray(stereo_clip[:, ::-1]),
                                  stereo.codec.sample_rate)
    assert_differs(stereo.codec.decode(swapped), reference_audio, atol=DECODE_ATOL,
                   what="decode of the channel-swapped input")


def test_sliding_window_matches_reference_past_every_window(stereo, codes, reference_audio):
    """The 3 s clip gives every transformer stage of both towers more than twice its window of
    positions, so each runs with a full, sliding window; a window one frame shorter or longer
    in any decoder stage (Nano decoder.1: 113 = int(), not 114 = round()) moves the reference
    past the tolerance, so the parity above pins every window."""
    cfg = ref.codec_config(stereo.config)
    transformer_stages = [(tower, i, s) for tower in ("encoder", "decoder")
                          for i, s in enumerate(cfg[tower]) if s["kind"] == "transformer"]
    for tower, i, s in transformer_stages:
        positions = N_FRAMES * s["rate_in"] / cfg["frame_rate"]
        assert positions > 2 * s["context"], (tower, i, positions, s["context"])
    first = next(i for tower, i, _ in transformer_stages if tower == "decoder")
    assert_close(reference_decode_with_context(stereo.state, stereo.config, codes, stage=first,
                                               delta=0),
                 reference_audio, atol=0.0, what="stage-by-stage reference")
    assert_close(stereo.codec.decode(codes), reference_audio, atol=DECODE_ATOL,
                 what="decode past the window")
    for tower, i, s in transformer_stages:
        if tower != "decoder":
            continue
        for delta in (-1, 1):
            other = reference_decode_with_context(stereo.state, stereo.config, codes, stage=i,
                                                  delta=delta)
            assert_differs(other, reference_audio, atol=DECODE_ATOL,
                           what=f"decoder.{i} context {s['context']}{delta:+d}")


@pytest.mark.parametrize("k", [1, 3])
def test_partial_decode_equals_decode_of_first_k_and_matches_reference(stereo, codes, k):
    c = stereo.codec
    got = c.decode(codes, n_quantizers=k)
    assert got.shape == (N_FRAMES * c.downsample_rate, 2)
    assert_close(got, c.decode(codes[:k]), atol=0.0, what=f"n_quantizers={k} vs codes[:{k}]")
    assert_close(got, ref.decode(stereo.state, stereo.config, codes, n_quantizers=k),
                 atol=DECODE_ATOL, what=f"partial decode k={k}")
    # sensitivity guard: the next codebook is not silently included or ignored
    assert_differs(got, c.decode(codes[:k + 1]), atol=DECODE_ATOL, what=f"k={k} vs k+1")


def test_chunk_seconds_does_not_change_stereo_results(stereo, stereo_clip, codes):
    with Codec.load(stereo.gguf, chunk_seconds=0.1, threads=THREADS) as small:
        assert small.chunk_frames == 5
        default = default_chunk_seconds(small.config)
        assert stereo.codec.chunk_frames == math.ceil(default * small.config.frame_rate)
        assert np.array_equal(small.encode(stereo_clip, small.sample_rate), codes)
        err = assert_close(small.decode(codes), stereo.codec.decode(codes), atol=CHUNK_ATOL,
                           what="decode, 0.1 s vs default chunks")
    print(f"{stereo.name}: chunk 0.1 s vs default decode max error {err:.3g}")


# -- streaming (each check in a fresh interpreter, as tests/codec/test_streaming.py) ------------


def check_stereo_streaming_matches_offline(gguf, sizes):
    with Codec.load(gguf, threads=THREADS) as codec:
        ds = codec.downsample_rate
        codes = np.random.default_rng(21).integers(0, codec.config.codebook_size,
                                                   (codec.n_quantizers, N_FRAMES), dtype=np.int32)
        offline = codec.decode(codes)
        with codec.stream_decoder() as decoder:
            got = push_all(decoder, codes, irregular(sizes))
            assert decoder.flush().shape == (0, 2)
        err = assert_close(got, offline, atol=CHUNK_ATOL, what=f"streamed in chunks {sizes}")
        # sensitivity guard: a wrong code in frame 75 leaves earlier samples alone and changes
        # that frame's and later ones, in both channels
        wrong = codes.copy()
        wrong[0, 75] = (wrong[0, 75] + 1) % codec.config.codebook_size
        with codec.stream_decoder() as decoder:
            bad = push_all(decoder, wrong, irregular(sizes))
    assert_close(bad[:75 * ds], offline[:75 * ds], atol=CHUNK_ATOL, what="before the bad code")
    for ch in range(2):
        assert_differs(bad[75 * ds:80 * ds, ch], offline[75 * ds:80 * ds, ch], atol=CHUNK_ATOL,
                       what=f"channel {ch} from the bad code on")
    print(f"max error {err:.3g}")


@pytest.mark.parametrize("sizes", CHUNKINGS.values(), ids=CHUNKINGS.keys())
def test_stereo_streaming_decode_matches_offline(stereo, sizes):
    out = run_isolated(check_stereo_streaming_matches_offline, stereo.gguf, sizes)
    print(f"{stereo.name} {sizes}: {out.strip()}")


@pytest.mark.parametrize("rate_factor", [1, 2.5])   # the codec's rate, and resampled
def test_encode_blocks_of_stereo_audio_gives_the_codes_of_encode(stereo, stereo_clip, rate_factor):
    sr = int(stereo.codec.sample_rate * rate_factor)
    x = stereo_clip if rate_factor == 1 else resample(stereo_clip, stereo.codec.sample_rate, sr)
    want = stereo.codec.encode(x, sr)
    blocks = (x[i:i + 700] for i in range(0, len(x), 700))
    np.testing.assert_array_equal(stereo.codec.encode_blocks(blocks, sr), want)
