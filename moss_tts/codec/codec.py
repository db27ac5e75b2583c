"""`Codec`: MOSS-Audio-Tokenizer from one GGUF — encode, decode (first-k partial), reconstruct,
and an exact streaming decoder. Not thread-safe: use one Codec per thread."""

from __future__ import annotations

import logging
import math

import numpy as np

from ..audio import StreamResampler, as_sample_rate, as_samples, resample, to_channels
from ..errors import InputError, whole_number
from ..ggml import I32, Graph, Weights, allocator_for, get_backend
from ..ggml.backend import NativeResource, released_on_error
from . import rlfq
from .config import FORMAT_VERSION, KIND, CodecConfig, tensor_shapes
from .stream_batch import StreamBatch
from .tower import TowerState, load_tower, run_tower

logger = logging.getLogger(__name__)

# Audio per graph run. Any chunk gives the same result (exact caches); the default gives the
# fastest stage (the highest rate) about CHUNK_POSITIONS positions: long enough for full matmul
# rows in the slowest stage, short enough that windowed attention and its host-built masks stay
# small. Measured best: 10 s for the 24 kHz codec (100 Hz stages, bench/codec.py), 2-2.5 s for
# Nano (400 Hz, bench/codec48k.py: 0.59 s vs 0.67 s at 10 s for 10 s of audio).
CHUNK_POSITIONS = 1000
CHUNK_SECONDS_RANGE = (2.0, 10.0)
CHUNK_SECONDS = None  # derived per codec, see default_chunk_seconds()
STREAM_PUSH_FRAMES = 8  # streaming decode: the largest push run as one graph (upstream uses 8)
STREAM_POOL = 2  # idle stream decoders' runners kept per push size (each holds its KV caches)


def default_chunk_seconds(cfg: CodecConfig) -> float:
    """Seconds per graph run giving the highest-rate stage about CHUNK_POSITIONS positions."""
    from .tower import positions_per_frame

    per_frame = max(positions_per_frame(cfg, "encoder")[i]
                    for i, s in enumerate(cfg.encoder) if s.kind == 1)
    seconds = CHUNK_POSITIONS / (per_frame * cfg.frame_rate)
    lo, hi = CHUNK_SECONDS_RANGE
    return min(hi, max(lo, seconds))


def stream_rowwise(weights) -> bool:
    """Whether stream decoders multiply row by row (Graph.rowwise), so a stream's output is the
    same bits alone and in a StreamBatch: where every decoder weight type needs at most the pair
    trick (f32, f16, q8_0 here: no cost). Where a type's kernel changes with the row count (the
    K-quants from 8 rows, ggml.rowwise), row-wise would multiply each of a push's rows on its
    own — on the v2 codec's last stage 32 rows a frame — so there the graphs are plain and a
    stream in a batch equals it alone to that type's rounding."""
    from ..ggml.rowwise import plan

    types = {t.type for n, t in weights.file.tensors.items()
             if n.startswith("decoder.") and len(t.shape) == 2}
    return all(plan(weights.backend, t, False).alone_from is None for t in types)


class _TowerRunner:
    """One tower's caches, and its graphs by (frames, codebooks): built once, replayed."""

    def __init__(self, codec: "Codec", tower: str, chunk_frames: int, *, prefix="chunk",
                 v_trans=False, rowwise=False):
        self.codec, self.tower, self.chunk, self.rowwise = codec, tower, chunk_frames, rowwise
        self.state = TowerState(codec.config, tower, chunk_frames, codec.backend,
                                prefix=prefix, v_trans=v_trans)
        self.allocator = allocator_for(codec.backend)
        self.graphs: dict[tuple, Graph] = {}

    def graph(self, n_frames: int, n_q: int, counts: tuple[int, ...]) -> Graph:
        key = (n_frames, n_q, counts)
        if key not in self.graphs:
            self.graphs[key] = self._build(n_frames, n_q, counts)
        return self.graphs[key]

    def _build(self, n_frames: int, n_q: int, counts: tuple[int, ...]) -> Graph:
        c = self.codec
        g = Graph(c.backend, name=f"{self.tower}[{n_frames}x{n_q}]", allocator=self.allocator,
                  rowwise=self.rowwise)
        stage_inputs = self.state.graph_inputs(g, n_frames, counts)
        if self.tower == "encoder":
            x = g.input("samples", (n_frames * c.config.stream_samples_per_frame, 1))  # [1, T]
            z = run_tower(x, c._encoder, c.config, self.state, stage_inputs)   # [code_dim, N]
            for i, k in enumerate(rlfq.quantize(z, c.weights, c.tables, n_q)):
                g.output(k, f"codes.{i}", ndim=1)
        else:
            ids = g.input("codes", (n_q * n_frames,), I32)   # rlfq.stacked_ids of [n_q, N]
            z = rlfq.dequantize(ids, n_q, c.weights, c.tables)                 # [code_dim, N]
            y = run_tower(z, c._decoder, c.config, self.state, stage_inputs)   # [1, T]
            g.output(y, "samples", ndim=2)
        return g.build()

    def run(self, n_frames: int, n_q: int, feed: dict) -> dict:
        counts = self.state.slot_counts(n_frames)
        graph = self.graph(n_frames, n_q, counts)
        return graph.run(feed | self.state.advance(n_frames, counts))

    def close(self) -> None:
        for g in self.graphs.values():
            g.close()
        self.graphs.clear()
        self.state.close()
        self.allocator.close()


class Codec(NativeResource):
    """A MOSS audio codec. `Codec.load("codec.gguf")`, then `encode(samples, sample_rate)` →
    int32 codes [n_quantizers, frames], and `decode(codes)` → float32 samples [n, channels].

    >>> codec = Codec.load("moss-audio-tokenizer.gguf")                  # doctest: +SKIP
    >>> codes = codec.encode(wav, 24000)                                 # doctest: +SKIP
    >>> audio = codec.decode(codes, n_quantizers=8)                      # doctest: +SKIP
    """

    NAME = "MOSS-Audio-Tokenizer"      # as the registry's codec row names it

    def __init__(self, weights: Weights, *, chunk_seconds: float | None = CHUNK_SECONDS):
        self.weights = weights
        self.backend = weights.backend
        with released_on_error(self):
            weights.file.check_kind(KIND, version=FORMAT_VERSION)
            self.config = CodecConfig.from_gguf(weights.file)
            weights.require(tensor_shapes(self.config), floats=True)
            self.tables = rlfq.derived_tables(weights, self.config, self.backend)
            self._encoder = load_tower(weights, self.config, "encoder")
            self._decoder = load_tower(weights, self.config, "decoder")
            self.stream_rowwise = stream_rowwise(weights)
        if chunk_seconds is None:
            chunk_seconds = default_chunk_seconds(self.config)
        self.chunk_frames = max(1, math.ceil(chunk_seconds * self.config.frame_rate))
        self._runners: dict[str, _TowerRunner] = {}
        # idle streaming runners by push size: a new StreamDecoder (one per utterance or server
        # request) takes one with its graphs already built instead of building them again
        self._stream_pool: dict[int, list[_TowerRunner]] = {}
        logger.info("codec %s: %d Hz, %d channel(s), %d codebooks, %.1f MiB of weights",
                    self.config.variant, self.sample_rate, self.channels, self.n_quantizers,
                    weights.nbytes / 2**20)

    @classmethod
    def load(cls, path, *, backend=None, threads: int | None = None, **options) -> "Codec":
        return cls(Weights.load(path, get_backend(backend, threads)), **options)

    # -- facts ------------------------------------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def channels(self) -> int:
        return self.config.channels

    @property
    def n_quantizers(self) -> int:
        return self.config.n_quantizers

    @property
    def downsample_rate(self) -> int:
        return self.config.downsample_rate

    # -- encode / decode --------------------------------------------------------------------------
    def encode(self, samples, sample_rate: int, *, n_quantizers: int | None = None,
               progress=None) -> np.ndarray:
        """samples [n] or [n, channels] at sample_rate → int32 codes [n_quantizers, n // ds].

        Audio is resampled to the codec rate; no normalization or DC removal. A trailing
        partial frame is dropped (upstream reports floor(n / downsample_rate) frames)."""
        self._need_open()
        x = resample(to_channels(as_samples(samples), self.channels), sample_rate,
                     self.sample_rate)
        return self._encode_stream([x], n_quantizers, len(x) // self.downsample_rate, progress)

    def encode_blocks(self, blocks, sample_rate: int, *, n_quantizers: int | None = None,
                      total: int | None = None, progress=None) -> np.ndarray:
        """Consecutive blocks [n, channels] of one signal → the codes `encode` gives for all of
        it, holding about one graph run of audio at a time (an hour-long file in bounded
        memory). `total`: samples per channel, if known, for progress."""
        self._need_open()
        sample_rate = as_sample_rate(sample_rate)
        resampler = StreamResampler(sample_rate, self.sample_rate)

        def at_codec_rate():
            for block in blocks:
                if np.asarray(block).size:
                    yield resampler.push(to_channels(as_samples(block), self.channels))
            yield resampler.flush()

        frames = None if total is None else \
            int(total) * self.sample_rate // sample_rate // self.downsample_rate
        return self._encode_stream(at_codec_rate(), n_quantizers, frames, progress)

    def _encode_stream(self, parts, n_quantizers, total_frames, progress) -> np.ndarray:
        """Audio at the codec rate, in parts of any size → codes, one graph run per
        `chunk_frames` frames as they fill (the same runs `encode` makes of the whole)."""
        n_q = self._n_q(n_quantizers)
        runner = self._runner("encoder")
        per_run = runner.chunk * self.downsample_rate
        pending, codes, done = np.zeros((0, self.channels), np.float32), [], 0
        for part in parts:
            pending = np.concatenate([pending, part]) if len(pending) else part
            while len(pending) >= per_run:
                codes.append(self._encode_run(runner, pending[:per_run], n_q))
                pending = pending[per_run:]
                done += runner.chunk
                if progress is not None:
                    progress(done, max(done, total_frames or 0))
        tail = len(pending) // self.downsample_rate
        if tail:
            codes.append(self._encode_run(runner, pending[:tail * self.downsample_rate], n_q))
            done += tail
            if progress is not None:
                progress(done, done)
        if not codes:
            raise InputError(f"audio is shorter than one code frame ({self.downsample_rate} "
                             f"samples at {self.sample_rate} Hz)")
        return np.concatenate(codes, axis=1)

    def _encode_run(self, runner: _TowerRunner, x: np.ndarray, n_q: int) -> np.ndarray:
        """One graph run: samples [f·ds, channels] → codes [n_q, f]."""
        f = len(x) // self.downsample_rate
        out = runner.run(f, n_q, {"samples": x.reshape(-1, 1)})
        return np.stack([out[f"codes.{i}"] for i in range(n_q)]).astype(np.int32)

    def decode(self, codes, *, n_quantizers: int | None = None, progress=None) -> np.ndarray:
        """int codes [k, frames] → float32 samples [frames · ds, channels], from the first
        n_quantizers codebooks (default: all rows given)."""
        self._need_open()
        codes = self.check_codes(codes, n_quantizers)
        runner = self._runner("decoder")
        parts = []
        for start, f in self._chunks(codes.shape[1], runner, progress):
            feed = {"codes": self._stacked(codes[:, start:start + f])}
            parts.append(runner.run(f, codes.shape[0], feed)["samples"])
        return self._to_output(np.concatenate(parts))

    def reconstruct(self, samples, sample_rate: int, *, n_quantizers: int | None = None,
                    progress=None) -> np.ndarray:
        return self.decode(self.encode(samples, sample_rate, n_quantizers=n_quantizers,
                                       progress=progress), progress=progress)

    def stream_decoder(self, *, n_quantizers: int | None = None,
                       max_push_frames: int = STREAM_PUSH_FRAMES) -> "StreamDecoder":
        """A decoder fed code frames as they arrive; its output concatenated equals decode().
        Pushes longer than max_push_frames are split (it sizes the per-stage caches)."""
        self._need_open()
        return StreamDecoder(self, self._n_q(n_quantizers),
                             whole_number(max_push_frames, "max_push_frames", 1))

    def stream_batch(self, max_streams: int, *, n_quantizers: int | None = None,
                     max_push_frames: int = STREAM_PUSH_FRAMES) -> "StreamBatch":
        """Up to max_streams streams decoded together, one graph per push for all of them;
        each stream's output equals its own stream_decoder()'s (codec/stream_batch.py)."""
        self._need_open()
        return StreamBatch(self, whole_number(max_streams, "max_streams", 1),
                           self._n_q(n_quantizers),
                           whole_number(max_push_frames, "max_push_frames", 1))

    # -- helpers ----------------------------------------------------------------------------------
    def check_codes(self, codes, n_quantizers: int | None = None) -> np.ndarray:
        self._need_open()
        c = np.asarray(codes)
        if c.dtype.kind not in "iu":
            raise InputError(f"codes must be integers, got dtype {c.dtype}")
        if c.ndim != 2 or c.shape[1] == 0 or c.shape[0] == 0:
            raise InputError(f"codes must have shape [n_quantizers, frames], got {c.shape}")
        k = c.shape[0] if n_quantizers is None else whole_number(n_quantizers, "n_quantizers", 0)
        if not 1 <= k <= min(c.shape[0], self.n_quantizers):
            raise InputError(f"cannot decode {k} codebooks from codes with {c.shape[0]} rows "
                             f"(this codec has {self.n_quantizers})")
        c = c[:k]
        bad = (c < 0) | (c >= self.config.codebook_size)
        if bad.any():
            q, t = np.argwhere(bad)[0]
            raise InputError(f"code {c[q, t]} at codebook {q}, frame {t} is outside "
                             f"[0, {self.config.codebook_size}) — pad codes are not codec input")
        return np.ascontiguousarray(c, dtype=np.int32)

    def _take_stream_runner(self, max_push_frames: int) -> _TowerRunner:
        pool = self._stream_pool.get(max_push_frames)
        if pool:
            runner = pool.pop()
            runner.state.reset()
            return runner
        # few query rows against long windows: the softmax path over a transposed V cache beats
        # ggml's CPU flash attention (untiled below 64 rows) severalfold. While the windows fill,
        # pushes attend over a prefix growing by doubling: about log2(window) graphs, built once.
        # Row-wise matmuls where they cost nothing: each row's product as in a push of several
        # streams (stream_batch.py)
        return _TowerRunner(self, "decoder", max_push_frames, prefix="doubling", v_trans=True,
                            rowwise=self.stream_rowwise)

    def _return_stream_runner(self, runner: _TowerRunner) -> None:
        pool = self._stream_pool.setdefault(runner.chunk, [])
        if self.weights is None or len(pool) >= STREAM_POOL:   # closed codec, or enough idle
            runner.close()
        else:
            pool.append(runner)

    def _stacked(self, codes: np.ndarray) -> np.ndarray:
        return rlfq.stacked_ids(codes, self.config.codebook_size)

    def _n_q(self, n_quantizers: int | None) -> int:
        if n_quantizers is None:
            return self.n_quantizers
        return whole_number(n_quantizers, "n_quantizers", 1, self.n_quantizers)

    def _need_open(self) -> None:
        if self.weights is None:
            raise InputError("this codec is closed; load it again with Codec.load(...)")

    def _runner(self, tower: str) -> _TowerRunner:
        runner = self._runners.get(tower)
        if runner is None:
            runner = self._runners[tower] = _TowerRunner(self, tower, self.chunk_frames)
        runner.state.reset()
        return runner

    def _chunks(self, n_frames: int, runner: _TowerRunner, progress):
        for start in range(0, n_frames, runner.chunk):
            yield start, min(runner.chunk, n_frames - start)
            if progress is not None:
                progress(min(start + runner.chunk, n_frames), n_frames)

    def _to_output(self, stream: np.ndarray) -> np.ndarray:
        """Tower output [T, 1] → samples [n, channels] (stereo codecs de-interleave L R L R)."""
        return np.ascontiguousarray(stream.reshape(-1, self.channels))

    def close(self) -> None:
        for r in getattr(self, "_runners", {}).values():
            r.close()
        self._runners = {}
        for pool in getattr(self, "_stream_pool", {}).values():
            for r in pool:
                r.close()
        self._stream_pool = {}
        if getattr(self, "tables", None) is not None:
            self.tables.close()
            self.tables = None
        if getattr(self, "weights", None) is not None:
            self.weights.close()
            self.weights = None


class StreamDecoder(NativeResource):
    """`push(codes [k, frames])` → the samples those frames complete; `flush()` → the rest
    (nothing: every stage is causal and frame-local, so each frame completes at once)."""

    def __init__(self, codec: Codec, n_q: int, max_push_frames: int):
        self.codec, self.n_q = codec, n_q
        self._runner = codec._take_stream_runner(max_push_frames)
        self.frames = 0

    def push(self, codes) -> np.ndarray:
        if self._runner is None:
            raise InputError("this stream decoder is closed; make a new one with "
                             "codec.stream_decoder()")
        c = np.asarray(codes)
        if c.ndim == 2 and c.shape[1] == 0 and c.shape[0] >= self.n_q:   # an empty chunk
            return np.zeros((0, self.codec.channels), dtype=np.float32)
        codes = self.codec.check_codes(c, self.n_q)
        parts = []
        for start, f in self.codec._chunks(codes.shape[1], self._runner, None):
            feed = {"codes": self.codec._stacked(codes[:, start:start + f])}
            parts.append(self._runner.run(f, self.n_q, feed)["samples"])
        self.frames += codes.shape[1]
        return self.codec._to_output(np.concatenate(parts))

    def flush(self) -> np.ndarray:
        return np.zeros((0, self.codec.channels), dtype=np.float32)

    def close(self) -> None:
        if getattr(self, "_runner", None) is not None:
            self.codec._return_stream_runner(self._runner)
            self._runner = None
