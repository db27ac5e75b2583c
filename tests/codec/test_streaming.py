"""moss_tts/codec/codec.py StreamDecoder: code frames pushed as they arrive, in any chunking, give
the offline decode (docs/upstream-notes.md §codecs-1.9: every stage is causal with a per-stage
window cache).

Each check runs in a fresh interpreter (`run_isolated`): pushing a chunk larger than any before
and then replaying a smaller one corrupts the heap today (the shared compute allocator grows and
the older graph keeps pointers into the freed buffer), and that must fail a test, not abort the
session. The check bodies are the module-level `check_*` functions."""

import itertools

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.codec import Codec
from moss_tts.errors import InputError

from .conftest import THREADS, run_isolated

# Same f32 graph, different chunkings: only the summation order inside softmax and the matmuls
# changes (more or fewer masked cache slots). Measured ≤ 4e-6 against outputs peaking near 18.
STREAM_ATOL = 1e-5
N_FRAMES = 150  # 3 s: past the 25/50/100-position windows of all three decoder stages
# irregular includes a chunk longer than the codec's 100-frame graph chunk
CHUNKINGS = {"one_frame": "1", "irregular": "1,3,7,2,11,5,104", "all_at_once": str(N_FRAMES)}


def stream_codes(codec, seed=21):
    return np.random.default_rng(seed).integers(0, codec.config.codebook_size,
                                                (codec.n_quantizers, N_FRAMES), dtype=np.int32)


def irregular(sizes, total=N_FRAMES):
    """Chunk lengths cycling through `sizes` ("1,3,7" or a list), the last cut to fit `total`."""
    if isinstance(sizes, str):
        sizes = [int(s) for s in sizes.split(",")]
    out, done = [], 0
    for n in itertools.cycle(sizes):
        n = min(n, total - done)
        out.append(n)
        done += n
        if done == total:
            return out


def push_all(decoder, codes, sizes):
    parts, start = [], 0
    for n in sizes:
        part = decoder.push(codes[:, start:start + n])
        assert part.shape == (n * decoder.codec.downsample_rate, decoder.codec.channels), \
            (n, part.shape)
        parts.append(part)
        start += n
    return np.concatenate(parts)


# -- check bodies (run in a fresh interpreter) ------------------------------------------------


def check_streaming_matches_offline(gguf, sizes):
    with Codec.load(gguf, threads=THREADS) as codec:
        codes = stream_codes(codec)
        offline = codec.decode(codes)
        with codec.stream_decoder() as decoder:
            got = push_all(decoder, codes, irregular(sizes))
            assert decoder.flush().shape == (0, 1)
            if sizes == "1":
                # while the rings fill, the attended prefix doubles: a handful of graphs (here
                # 8, 16, 32, 64 frames, then the full rings), not one per push
                n_graphs = len(decoder._runner.graphs)
                assert 2 <= n_graphs <= 6, f"{n_graphs} graphs built for one-frame pushes"
        err = assert_close(got, offline, atol=STREAM_ATOL, what=f"streamed in chunks {sizes}")
    print(f"max error {err:.3g}")


def check_any_grouping_gives_the_same_samples(gguf):
    """How many frames a push holds is the chunk ladder's choice, and the ladder follows the
    clock (models/chunk_ladder.py): a stream's samples must not depend on it."""
    with Codec.load(gguf, threads=THREADS) as codec:
        assert codec.stream_rowwise
        codes = stream_codes(codec)
        got = {}
        for sizes in ("1", "1,3,7,2,11,5", "2", "8"):
            with codec.stream_decoder() as decoder:
                got[sizes] = push_all(decoder, codes, irregular(sizes))
    for sizes, samples in got.items():
        assert np.array_equal(samples, got["1"]), \
            f"pushes of {sizes} frames: {np.abs(samples - got['1']).max():.3g} from one-frame pushes"


def check_streaming_partial_decode(gguf):
    with Codec.load(gguf, threads=THREADS) as codec:
        codes = stream_codes(codec)
        with codec.stream_decoder(n_quantizers=3) as decoder:
            got = push_all(decoder, codes, irregular([4, 9, 1]))
        assert_close(got, codec.decode(codes, n_quantizers=3), atol=STREAM_ATOL,
                     what="streamed partial decode")


def check_corrupted_code_changes_only_later_output(gguf):
    with Codec.load(gguf, threads=THREADS) as codec:
        ds, codes = codec.downsample_rate, stream_codes(codec)
        offline = codec.decode(codes)
        wrong = codes.copy()
        wrong[0, 75] = (wrong[0, 75] + 1) % codec.config.codebook_size
        with codec.stream_decoder() as decoder:
            got = push_all(decoder, wrong, irregular([1, 3, 7, 2]))
    assert_close(got[:75 * ds], offline[:75 * ds], atol=STREAM_ATOL, what="before the bad code")
    assert_differs(got[75 * ds:76 * ds], offline[75 * ds:76 * ds], atol=STREAM_ATOL,
                   what="the frame with the bad code")
    assert_differs(got[76 * ds:80 * ds], offline[76 * ds:80 * ds], atol=STREAM_ATOL,
                   what="frames after the bad code (carried through the caches)")


def check_interleaved_decoders(gguf):
    with Codec.load(gguf, threads=THREADS) as codec:
        codes_a, codes_b = stream_codes(codec, seed=21), stream_codes(codec, seed=22)
        offline_a, offline_b = codec.decode(codes_a), codec.decode(codes_b)
        a, b = codec.stream_decoder(), codec.stream_decoder()
        parts_a, parts_b, ia, ib = [], [], 0, 0
        for na, nb in itertools.zip_longest(irregular([2, 5, 1]), irregular([7, 3])):
            if na:
                parts_a.append(a.push(codes_a[:, ia:ia + na]))
                ia += na
            if nb:
                parts_b.append(b.push(codes_b[:, ib:ib + nb]))
                ib += nb
            codec.decode(codes_b[:, :3])  # an offline decode in between touches neither stream
        a.close()
        b.close()
    got_a, got_b = np.concatenate(parts_a), np.concatenate(parts_b)
    assert_close(got_a, offline_a, atol=STREAM_ATOL, what="stream a")
    assert_close(got_b, offline_b, atol=STREAM_ATOL, what="stream b")
    assert_differs(got_a, got_b, atol=STREAM_ATOL, what="the two streams")


def check_reused_decoder_starts_clean(gguf):
    """A closed decoder's caches and graphs go back to the codec and serve the next decoder (no
    graph is built again), which must start from empty caches: stream b after stream a equals
    b's offline decode, and differs from b decoded after a without the reset."""
    with Codec.load(gguf, threads=THREADS) as codec:
        codes_a, codes_b = stream_codes(codec, seed=21), stream_codes(codec, seed=22)
        offline_b = codec.decode(codes_b)
        with codec.stream_decoder() as first:
            push_all(first, codes_a, irregular([1, 3]))
            runner, graphs = first._runner, dict(first._runner.graphs)
        with codec.stream_decoder() as second:
            assert second._runner is runner, "the idle runner was not reused"
            got = push_all(second, codes_b, irregular([1, 3]))
            assert second._runner.graphs == graphs, "reused decoder built new graphs"
        with pytest.raises(InputError, match="closed"):
            second.push(codes_b[:, :1])
        continued = codec.decode(np.concatenate([codes_a, codes_b], axis=1))[-len(offline_b):]
    assert_close(got, offline_b, atol=STREAM_ATOL, what="reused decoder vs offline")
    assert_differs(got, continued, atol=STREAM_ATOL, what="b decoded as a continuation of a")


# -- tests ------------------------------------------------------------------------------------


def test_reused_stream_decoder_starts_from_empty_caches(codec_gguf):
    run_isolated(check_reused_decoder_starts_clean, codec_gguf)



@pytest.mark.parametrize("sizes", CHUNKINGS.values(), ids=CHUNKINGS.keys())
def test_streaming_decode_matches_offline(codec_gguf, sizes):
    run_isolated(check_streaming_matches_offline, codec_gguf, sizes)


def test_a_streams_samples_do_not_depend_on_how_its_pushes_group_frames(codec_gguf):
    run_isolated(check_any_grouping_gives_the_same_samples, codec_gguf)


def test_streaming_partial_decode_matches_offline_partial_decode(codec_gguf):
    run_isolated(check_streaming_partial_decode, codec_gguf)


def test_streaming_corrupted_code_changes_only_later_output(codec_gguf):
    """Sensitivity guard: the stream really carries state — a wrong code in frame 75 leaves the
    samples before it alone and changes that frame and later ones."""
    run_isolated(check_corrupted_code_changes_only_later_output, codec_gguf)


def test_two_stream_decoders_interleaved_do_not_share_state(codec_gguf):
    run_isolated(check_interleaved_decoders, codec_gguf)


def test_flush_returns_no_samples(codec):
    codes = stream_codes(codec)
    with codec.stream_decoder() as decoder:
        assert decoder.flush().shape == (0, codec.channels)
        empty = decoder.push(codes[:, :0])            # an empty chunk from a producer is fine
        assert empty.shape == (0, codec.channels) and empty.dtype == np.float32
        decoder.push(codes[:, :4])
        tail = decoder.flush()
    assert tail.shape == (0, codec.channels) and tail.dtype == np.float32
