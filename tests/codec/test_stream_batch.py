"""moss_tts/codec/stream_batch.py StreamBatch: several codec streams decoded in one graph per
push give each stream exactly what its own StreamDecoder gives for the same pushes (issue 35):
streams joining and leaving, pushing different frame counts in one call (more than a graph's
chunk too), a stream primed by a multi-frame push, on the mono (24 kHz-style) and the stereo
(Nano-style) tiny codecs. The equality checks run in a fresh interpreter (`run_isolated`, as
tests/codec/test_streaming.py's do: graphs that share a growing compute allocator)."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.codec import Codec
from moss_tts.codec.stream_batch import MAX_GRAPHS
from moss_tts.errors import InputError

from .conftest import THREADS, run_isolated

# Each stream's rows go through the ops its decoder alone runs: its own caches, prefixes and
# graph chunks, every matmul row-wise (Graph.rowwise), row-wise ops over more rows summing each
# row alike. Measured 0 (bit-equal) on both tiny codecs.
BATCH_ATOL = 0.0
# the guard: one changed code moves its stream's audio far past f32 rounding
GUARD_ATOL = 1e-4
N_FRAMES = 60        # past the 0.5 s windows of the tiny decoders' stages (50 Hz frames)
# per call, the frames each of the three streams pushes (0: not in the call); stream 2 joins
# at call 2 primed by 20 frames (over two graph chunks of 8), stream 0 leaves after call 5
# and stream 3 takes its freed slot
SCHEDULE = [(1, 3, 0), (1, 1, 0), (2, 0, 20), (1, 7, 1), (9, 1, 1), (1, 2, 3)]


def _codes(codec, seed):
    return np.random.default_rng(seed).integers(0, codec.config.codebook_size,
                                                (codec.n_quantizers, N_FRAMES), dtype=np.int32)


def _schedule_pushes(codes):
    """The SCHEDULE, then one frame per call for the streams left, stream 3 joining where
    stream 0 left: a list of calls, each {stream: codes chunk}."""
    done = [0] * len(codes)
    calls = []
    for sizes in SCHEDULE:
        call = {}
        for k, n in enumerate(sizes):
            if n:
                call[k] = codes[k][:, done[k]:done[k] + n]
                done[k] += n
        calls.append(call)
    while done[1] < N_FRAMES or done[2] < N_FRAMES or done[3] < N_FRAMES:
        call = {k: codes[k][:, done[k]:done[k] + 1] for k in (1, 2, 3) if done[k] < N_FRAMES}
        for k in call:
            done[k] += 1
        calls.append(call)
    return calls


def _through_batch(codec, calls):
    """The calls through one StreamBatch of 3 slots: stream 0 is released after the
    SCHEDULE, stream 3 opened in the freed slot; → each stream's audio."""
    out = {k: [] for k in range(4)}
    with codec.stream_batch(3, max_push_frames=8) as batch:
        slot = {k: batch.open() for k in range(3)}
        for i, call in enumerate(calls):
            if i == len(SCHEDULE):
                freed = slot.pop(0)
                batch.release(freed)
                slot[3] = batch.open()
                assert slot[3] == freed
            got = batch.push({slot[k]: c for k, c in call.items()})
            for k in call:
                out[k].append(got[slot[k]])
        n_graphs = len(batch._graphs)
    assert n_graphs <= MAX_GRAPHS
    return {k: np.concatenate(v) for k, v in out.items()}


def _through_decoders(codec, calls):
    out = {k: [] for k in range(4)}
    decoders = {k: codec.stream_decoder(max_push_frames=8) for k in range(4)}
    for call in calls:
        for k, c in call.items():
            out[k].append(decoders[k].push(c))
    for d in decoders.values():
        d.close()
    return {k: np.concatenate(v) for k, v in out.items()}


# -- check bodies (run in a fresh interpreter) ------------------------------------------------


def check_batch_equals_stream_decoders(gguf):
    with Codec.load(gguf, threads=THREADS) as codec:
        codes = [_codes(codec, seed) for seed in (1, 2, 3, 4)]
        calls = _schedule_pushes(codes)
        want = _through_decoders(codec, calls)
        got = _through_batch(codec, calls)
        worst = 0.0
        for k in range(4):
            if k:             # stream 0 left early
                assert got[k].shape == (N_FRAMES * codec.downsample_rate, codec.channels)
            worst = max(worst, assert_close(got[k], want[k], atol=BATCH_ATOL,
                                            what=f"stream {k}: batched vs its own decoder"))
        # guard: one changed code in stream 2 (its frame 30) moves stream 2 from there on, and
        # leaves the other streams bit-equal
        codes[2][4, 30] = (codes[2][4, 30] + 1) % codec.config.codebook_size
        changed = _through_batch(codec, _schedule_pushes(codes))
        ds = codec.downsample_rate
        assert_differs(changed[2][30 * ds:], got[2][30 * ds:], atol=GUARD_ATOL,
                       what="stream 2 after a changed code")
        assert_close(changed[2][:30 * ds], got[2][:30 * ds], atol=BATCH_ATOL,
                     what="stream 2 before the changed code")
        for k in (0, 1, 3):
            assert_close(changed[k], got[k], atol=BATCH_ATOL, what=f"stream {k} beside it")
    print(f"max |batched - alone| {worst:.3g}")


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["v1", "nano"])
def test_stream_batch_equals_each_streams_own_decoder(tiny_codec, variant):
    out = run_isolated(check_batch_equals_stream_decoders, tiny_codec(variant))
    print(f"{variant}: {out.strip()}")


def test_stream_batch_partial_codebooks_equal_a_partial_stream_decoder(codec):
    codes = _codes(codec, 5)
    with codec.stream_batch(2, n_quantizers=3) as batch, \
            codec.stream_decoder(n_quantizers=3) as alone:
        a, b = batch.open(), batch.open()
        for t in range(0, 12, 3):
            got = batch.push({a: codes[:, t:t + 3], b: codes[:3, t:t + 3]})
            assert_close(got[a], alone.push(codes[:, t:t + 3]), atol=BATCH_ATOL,
                         what=f"frames {t}..{t + 2} of the first 3 codebooks")
            assert_close(got[b], got[a], atol=BATCH_ATOL, what="3 rows given vs all rows")


def test_stream_batch_bad_input_raises_one_line_errors(codec):
    codes = _codes(codec, 6)
    with codec.stream_batch(2) as batch:
        a = batch.open()
        with pytest.raises(InputError, match=r"slot 1 is not open"):
            batch.push({1: codes[:, :1]})
        with pytest.raises(InputError, match=r"slot 'x' is not open"):
            batch.push({"x": codes[:, :1]})
        bad = codes[:, :2].copy()
        bad[0, 1] = codec.config.codebook_size
        with pytest.raises(InputError, match=r"slot 0: code .* at codebook 0, frame 1"):
            batch.push({a: bad})
        with pytest.raises(InputError, match=r"slot 0: cannot decode"):
            batch.push({a: codes[:2, :1]})
        with pytest.raises(InputError, match=r"slot 0: codes must be integers"):
            batch.push({a: codes[:, :1].astype(np.float32)})
        with pytest.raises(InputError, match=r"push takes \{slot: codes\}"):
            batch.push(codes[:, :1])
        # a bad push moved no stream: its first frame is still a fresh stream's first frame
        with codec.stream_decoder() as alone:
            assert_close(batch.push({a: codes[:, :1]})[a], alone.push(codes[:, :1]),
                         atol=BATCH_ATOL, what="first push after refused ones")
        assert batch.push({a: codes[:, :0]})[a].shape == (0, codec.channels)
        batch.open()
        with pytest.raises(InputError, match=r"all 2 stream slots are open"):
            batch.open()
        batch.release(a)
        with pytest.raises(InputError, match=r"slot 0 is not open"):
            batch.release(a)
    with pytest.raises(InputError, match=r"stream batch is closed"):
        batch.push({a: codes[:, :1]})
    with pytest.raises(InputError, match=r"max_streams"):
        codec.stream_batch(0)


def test_a_stream_slot_decodes_as_a_stream_decoder_and_releases_its_slot(codec):
    codes = _codes(codec, 7)
    with codec.stream_batch(2) as batch, codec.stream_decoder() as alone:
        first, second = batch.stream(), batch.stream()
        assert batch.stream() is None                       # every slot is open
        for t in range(0, 10, 5):
            assert_close(first.push(codes[:, t:t + 5]), alone.push(codes[:, t:t + 5]),
                         atol=BATCH_ATOL, what=f"slot push of frames {t}..{t + 4}")
        assert first.flush().shape == (0, codec.channels)
        first.close()
        first.close()                                       # idempotent
        assert batch.slots == [second.slot]
        with pytest.raises(InputError, match=r"is not open"):
            first.push(codes[:, :1])
    second.close()                                          # after the batch closed: nothing


def test_stream_graphs_are_row_wise_only_where_it_costs_nothing(tiny_codec, monkeypatch):
    """Codec.stream_rowwise: f32 decoder weights need at most the pair trick, so stream graphs
    are row-wise (a stream the same bits alone and in a batch); a type whose kernel changes
    with the row count (the K-quants from 8 rows) would multiply each row on its own, so its
    graphs are plain, and a slot then equals its own stream decoder to f32 kernel order. The
    K-quant plan is given here: the tiny decoders' rows hold no K-quant block."""
    from moss_tts.ggml import rowwise
    from moss_tts.ggml.rowwise import RowPlan

    with Codec.load(tiny_codec("v1"), threads=THREADS) as codec:
        assert codec.stream_rowwise is True
    monkeypatch.setattr(rowwise, "plan", lambda *a: RowPlan(pair=False, alone_from=8))
    with Codec.load(tiny_codec("v1"), threads=THREADS) as codec:
        assert codec.stream_rowwise is False
        codes = _codes(codec, 5)
        batch = codec.stream_batch(2)
        a, b = batch.open(), batch.open()
        with codec.stream_decoder() as alone:
            for t in range(0, 24, 3):
                got = batch.push({a: codes[:, t:t + 3], b: codes[:, ::-1][:, t:t + 3]})
                assert not any(g.rowwise for g in batch._graphs.values())
                assert_close(got[a], alone.push(codes[:, t:t + 3]), atol=1e-5,
                             what="a slot beside another, plain graphs")
        batch.close()
