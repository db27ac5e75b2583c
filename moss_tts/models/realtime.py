"""MossTTSRealtime (MOSS-TTS-Realtime, 1.7B): a Qwen3 backbone over rows of 1 text + rvq audio
channels and a 4-layer Qwen3 local transformer that emits one frame's rvq codes, the text
leading the audio by 12 tokens (upstream `moss_tts_realtime/mossttsrealtime/modeling_*.py`,
`inferencer.py`, `streaming_mossttsrealtime.py`; docs/upstream-notes.md §family-5).

A row [text, code_0 … code_{rvq−1}] embeds as token_embd[text] + Σ_k embed_tokens.{k+1}[code_k]
(a pad code adds its zero padding row).
Per frame the local transformer runs rvq positions over a fresh cache: position 0 takes the
backbone's hidden state as it is, position j ≥ 1 takes local.embed_tokens.{j−1}[code_{j−1}]
(P16), and head j reads position j.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, InputError
from ..ggml import F16, F32, I32, GGMLType, Graph, Weights, ops
from ..ggml.backend import NativeResource, released_on_error
from ..ggml.graph import Tensor
from ..nn import CacheView, last_row
from ..nn.session import (DecodeSession, SessionsOwner, SharedDecodeSession, bucket, concat_rows,
                          frames_capacity)
from ..sampling import (RealtimeSamplingOptions, apply_repetition_penalty, check_finite,
                        greedy_token, sample_top_k_token, seen_windowed)
from . import qwen3, spec
from .rows import check_rows, row_feed

KIND = "realtime"
FORMAT_VERSION = 1
PREFIX = "moss.realtime"
LOCAL_PREFIX = "moss.realtime.local"      # the local transformer's Qwen3 hyperparameters
TOKENIZER_KEY = "moss.tokenizer.json"
TEXT_TABLE = "token_embd.weight"          # embed_tokens.0 under its llama.cpp name
LOCAL_LAYER = "local.blk.{}."
LOCAL_NORM = "local.output_norm.weight"
# Frames per turn when nobody says (upstream's inferencer class default max_length)
MAX_FRAMES = 1000


@dataclass(frozen=True)
class RealtimeConfig:
    """Field names and defaults of upstream `MossTTSRealtimeConfig` (+ the chat ids, the text
    lead `delay_tokens_len` of its processor and the codec rate)."""

    language_config: qwen3.Qwen3Config
    local_config: qwen3.Qwen3Config
    vocab_size: int
    rvq: int = 16
    audio_pad_token: int = 1024
    audio_vocab_size: int = 1027
    reference_audio_pad: int = qwen3.AUDIO_USER_SLOT_ID
    text_pad: int = qwen3.TEXT_PAD_ID
    pad_token_id: int = qwen3.PAD_ID
    im_start_token_id: int = qwen3.IM_START_ID
    im_end_token_id: int = qwen3.IM_END_ID
    delay_tokens_len: int = 12
    sampling_rate: int = 24000

    def __post_init__(self):
        if self.audio_vocab_size != self.audio_pad_token + 3:
            raise ConfigError(f"Realtime: audio_vocab_size {self.audio_vocab_size} is not the "
                              f"codebook ({self.audio_pad_token}) + pad, BOS and EOS")
        if self.local_config.hidden_size != self.language_config.hidden_size:
            raise ConfigError("Realtime: the local transformer takes the backbone's hidden state "
                              "as it is, so both must have the same width")
        if not 1 <= self.rvq <= 64 or self.delay_tokens_len < 1:
            raise ConfigError(f"Realtime: rvq {self.rvq} or delay_tokens_len "
                              f"{self.delay_tokens_len} is out of range (a corrupt file?)")
        top = max(self.reference_audio_pad, self.text_pad, self.pad_token_id,
                  self.im_start_token_id, self.im_end_token_id)
        if top >= self.vocab_size:
            raise ConfigError(f"Realtime: special id {top} lies outside the text vocabulary of "
                              f"{self.vocab_size}")

    @property
    def n_vq(self) -> int:
        return self.rvq

    @property
    def audio_rows(self) -> int:
        """Rows of each audio table and head: the codebook, the pad, BOS and EOS."""
        return self.audio_vocab_size

    @property
    def codebook_size(self) -> int:
        """Codes the codec takes: everything below the pad code."""
        return self.audio_pad_token

    @property
    def audio_bos(self) -> int:
        return self.audio_pad_token + 1

    @property
    def audio_eos(self) -> int:
        return self.audio_pad_token + 2

    @classmethod
    def from_gguf(cls, meta) -> "RealtimeConfig":
        return spec.config_from_gguf(
            cls, meta, PREFIX, language_config=qwen3.Qwen3Config.from_gguf(meta),
            local_config=spec.config_from_gguf(qwen3.Qwen3Config, meta, LOCAL_PREFIX))

    def to_metadata(self) -> dict:
        return (spec.config_to_metadata(self, PREFIX) | self.language_config.to_metadata()
                | spec.config_to_metadata(self.local_config, LOCAL_PREFIX))

    def tensor_shapes(self) -> dict[str, tuple]:
        """Backbone (llama.cpp names), its rvq audio tables, the local blocks (llama.cpp names
        below `local.`), its rvq − 1 input tables and rvq heads."""
        d, a, lc = self.language_config.hidden_size, self.audio_vocab_size, self.local_config
        shapes = {TEXT_TABLE: (self.vocab_size, d)} | self.language_config.tensor_shapes()
        shapes |= {f"embed_tokens.{k + 1}.weight": (a, d) for k in range(self.rvq)}
        for i in range(lc.num_hidden_layers):
            shapes |= spec.shapes(lc.layer_spec(), LOCAL_LAYER.format(i))
        shapes[LOCAL_NORM] = (d,)
        shapes |= {f"local.embed_tokens.{j}.weight": (a, d) for j in range(self.rvq - 1)}
        return shapes | {f"local.lm_heads.{j}.weight": (a, d) for j in range(self.rvq)}


@dataclass(frozen=True)
class RealtimeWeights:
    token_embd: Tensor
    embed_tokens: list[Tensor]          # the backbone's audio tables, codebook k at [k]
    layers: list[qwen3.Qwen3Layer]
    output_norm: Tensor
    local_layers: list[qwen3.Qwen3Layer]
    local_output_norm: Tensor
    local_embed_tokens: list[Tensor]    # rvq − 1: table j feeds local position j + 1 (P16)
    local_lm_heads: list[Tensor]        # rvq: head j reads local position j

    @classmethod
    def from_tensors(cls, t: dict, cfg: RealtimeConfig) -> "RealtimeWeights":
        lc = cfg.local_config
        return cls(t[TEXT_TABLE], [t[f"embed_tokens.{k + 1}.weight"] for k in range(cfg.rvq)],
                   qwen3.layers_from_tensors(t, cfg.language_config), t["output_norm.weight"],
                   [spec.fill_record(qwen3.Qwen3Layer, t, LOCAL_LAYER.format(i), lc.layer_spec())
                    for i in range(lc.num_hidden_layers)], t[LOCAL_NORM],
                   [t[f"local.embed_tokens.{j}.weight"] for j in range(cfg.rvq - 1)],
                   [t[f"local.lm_heads.{j}.weight"] for j in range(cfg.rvq)])


# -- graph builders ---------------------------------------------------------------------------
def build_backbone(g: Graph, w: RealtimeWeights, cfg: RealtimeConfig, n_rows: int,
                   kv: CacheView, last_only: bool) -> None:
    """Rows → "hidden" [D, R], post final norm, for the last row (R = 1) or every row. There is
    no text head: text is input only (§family-5.3)."""
    x = ops.get_rows(w.token_embd, g.input("rows.text", (n_rows,), I32))
    for k in range(cfg.rvq):   # a pad code's row is the zero padding row and is added too
        x = x + ops.get_rows(w.embed_tokens[k], g.input(f"rows.code.{k}", (n_rows,), I32))
    h = qwen3.forward(x, w.layers, w.output_norm, cfg.language_config, kv=kv)
    g.output(last_row(h) if last_only else h, "hidden", ndim=2)


def build_local_step(g: Graph, w: RealtimeWeights, cfg: RealtimeConfig, kv: CacheView,
                     j: int, n_rows: int = 1) -> None:
    """Local position j of a frame for n_rows streams (one row each): input the backbone hidden
    "local.h" (j = 0, no adapter) or local.embed_tokens.{j−1}["local.code"] (the code just
    drawn, P16); output head j's logits "local.logits" (n_rows, audio_vocab_size), nothing
    masked (P6)."""
    if j == 0:
        x = g.input("local.h", (n_rows, cfg.local_config.hidden_size))
    else:
        x = ops.get_rows(w.local_embed_tokens[j - 1], g.input("local.code", (n_rows,), I32))
    h = qwen3.forward(x, w.local_layers, w.local_output_norm, cfg.local_config, kv=kv,
                      stage="local")
    g.output(ops.mul_mat(w.local_lm_heads[j], h), "local.logits", ndim=2)


# -- sampling ---------------------------------------------------------------------------------
def choose_code(logits: np.ndarray, seen: np.ndarray | None, opts: RealtimeSamplingOptions,
                rng: np.random.Generator) -> int:
    """One codebook's code: the windowed penalty (None on a turn's first frame, P18), then
    argmax or a top-k / top-p draw over all audio_vocab_size logits (nothing masked, P6)."""
    check_finite(logits, "audio")
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, opts.audio_repetition_penalty)
    if opts.is_greedy:     # upstream's greedy keeps the penalty above
        return greedy_token(logits)
    return sample_top_k_token(logits, rng, temperature=opts.audio_temperature,
                              top_k=opts.audio_top_k, top_p=opts.audio_top_p)


def decodable(frames: np.ndarray, codebook_size: int) -> np.ndarray:
    """bool per frame [..., rvq]: every code is one the codec takes (no pad, BOS or EOS)."""
    frames = np.asarray(frames)
    return ((frames >= 0) & (frames < codebook_size)).all(axis=-1)


def sanitized(frames: np.ndarray, cfg: RealtimeConfig) -> np.ndarray:
    """Frames [N, rvq] up to the first one the codec cannot take (a pad, BOS or EOS sampled on
    any codebook ends the audio, as upstream's streaming sanitizer)."""
    frames = np.asarray(frames).reshape(-1, cfg.rvq)
    ok = decodable(frames, cfg.codebook_size)
    return frames if ok.all() else frames[:int(np.argmin(ok))]


class TurnSampler:
    """One turn's choices, shared by the one-stream path (FrameStream) and the batched one
    (realtime_decode.RealtimeBatch), so a stream makes the same draws alone or among others:
    its generator (a conversation's, kept across turns), its options, the frames drawn so far
    (the penalty's window, P18; the stop) and, offline, the text ids still to feed after the
    lead (`<|text_pad|>` once they are spent) and the frame budget (None: the caller's)."""

    def __init__(self, cfg: RealtimeConfig, options: RealtimeSamplingOptions,
                 rng: np.random.Generator, text_ids=(), max_frames: int | None = None):
        text_ids = [int(i) for i in text_ids]
        if any(not 0 <= i < cfg.vocab_size for i in text_ids):
            raise InputError(f"text ids must lie in [0, {cfg.vocab_size})")
        if max_frames is not None and max_frames < 1:
            raise InputError(f"max_frames must be at least 1, got {max_frames}")
        self.cfg, self.options, self.rng = cfg, options, rng
        self.text_ids, self.max_frames = text_ids, max_frames
        self.frames: list[np.ndarray] = []

    @property
    def finished(self) -> bool:
        """The turn's last frame has EOS on codebook 0 (the only stop, P6)."""
        return bool(self.frames) and self.frames[-1][0] == self.cfg.audio_eos

    @property
    def going(self) -> bool:
        """Another frame is due: not finished, and the budget (if any) not spent."""
        return not self.finished and (self.max_frames is None
                                      or len(self.frames) < self.max_frames)

    def seen(self) -> np.ndarray | None:
        """The next frame's penalty history: bool [rvq, audio_vocab_size] over the turn's last
        `repetition_window` frames; None on its first frame (unpenalized) or without a
        penalty."""
        if not self.frames or self.options.audio_repetition_penalty == 1.0:
            return None
        return seen_windowed(np.array(self.frames), self.cfg.audio_vocab_size,
                             self.options.repetition_window)

    def choose(self, j: int, logits: np.ndarray, seen: np.ndarray | None) -> int:
        """Code j of the frame being drawn, from head j's logits [audio_vocab_size]."""
        return choose_code(logits, None if seen is None else seen[j], self.options, self.rng)

    def row(self, text_id: int) -> np.ndarray:
        """The backbone row after the last frame: [text_id, that frame] (P15) [1, 1 + rvq]."""
        return np.concatenate([[text_id], self.frames[-1]])[None].astype(np.int64)

    def next_text(self) -> int:
        """The offline text id of the next row: the one after those of the frames so far,
        `<|text_pad|>` once they are spent."""
        n = len(self.frames) - 1
        return self.text_ids[n] if n < len(self.text_ids) else self.cfg.text_pad


# -- per-conversation state -------------------------------------------------------------------
class FrameStream(SessionsOwner):
    """One conversation's generation state (style C16): the backbone's decode session (its KV
    cache carries over between turns), the per-frame local session (16 slots, reset every
    frame, P29), the random stream and the current turn's `TurnSampler` (its frames, the
    penalty's history).

    `feed(rows)` appends rows; `start(rows)` appends rows and draws the turn's first frame;
    `step(text_id)` feeds the row [text_id, previous frame] — frames go back in one step late
    (P15) — and draws the next."""

    SESSIONS = ("backbone", "local")

    def __init__(self, model: "RealtimeModel", capacity: int, options: RealtimeSamplingOptions,
                 seed: int | None):
        self.model, self.options = model, options
        self.rng = np.random.default_rng(seed)
        self.backbone = model.make_backbone(capacity)
        with released_on_error(self.backbone):
            self.local = model.make_local()
        self.turn = TurnSampler(model.config, options, self.rng)
        self.fed: list[np.ndarray] = []     # every row the backbone holds, in order

    @property
    def position(self) -> int:
        return self.backbone.position

    @property
    def frames(self) -> list[np.ndarray]:
        """The current turn's frames, as drawn."""
        return self.turn.frames

    @property
    def finished(self) -> bool:
        return self.turn.finished

    def warm(self, rows_ahead: int) -> None:
        """Build now the step graphs that the next `rows_ahead` single rows and their frames
        will run (one per bucket crossed, and the local positions), so that none is built on
        the latency path: a graph build costs more than a step at the real size."""
        for k in range(1, rows_ahead + 1):
            n_slots = bucket(self.position + k, self.backbone.capacity)
            self.backbone.step_graph(n_slots, True).allocate()
        for j in range(self.model.config.rvq):
            self.local.step_graph(bucket(1, self.local.capacity), j).allocate()

    def feed(self, rows) -> np.ndarray:
        """Append rows (a prompt, or text rows of a lead arriving token by token) → the last
        row's hidden state [H]."""
        rows = check_rows(rows, self.model.config)
        self.fed.append(rows)
        return self.backbone.prefill(row_feed(rows), len(rows), variant=True)[-1]["hidden"][0]

    def refeed(self, rows) -> None:
        """Empty the backbone's cache and feed `rows` (what a trimmed conversation keeps): the
        cache is then exactly a fresh stream's fed the same rows. Frames and randomness go on."""
        self.backbone.reset()
        self.fed = []
        self.feed(rows)

    @property
    def rows(self) -> np.ndarray:
        """The rows the backbone holds [position, 1 + rvq]."""
        return np.vstack(self.fed)

    def start(self, rows, turn: TurnSampler | None = None) -> np.ndarray:
        """Append rows ending on the lead's BOS row → the turn's first frame, unpenalized;
        `turn`: its sampler (offline: with its text ids and budget), else a fresh one on this
        conversation's generator."""
        self.turn = turn or TurnSampler(self.model.config, self.options, self.rng)
        return self._draw(self.feed(rows))

    def step(self, text_id: int) -> np.ndarray:
        """The row [text_id, last frame] → the next frame, penalized over the turn's last
        `repetition_window` frames of each codebook."""
        if not self.frames:
            raise InputError("step() before start(): a turn starts with its lead rows")
        return self._draw(self.feed(self.turn.row(text_id)))

    def _draw(self, hidden: np.ndarray) -> np.ndarray:
        frame = self.model.sample_frame(self.local, hidden, self.turn)
        self.turn.frames.append(frame)
        return frame



# -- the runtime ------------------------------------------------------------------------------
class RealtimeModel(NativeResource):
    """MossTTSRealtime on a backend; stateless after load (style C16). `kv_type` is the
    backbone cache's (F16: about 112 KB per row at the 1.7B shape); the local cache is 16 f32
    slots per layer."""

    def __init__(self, weights: Weights, *, kv_type: GGMLType = F16):
        self.weights = weights
        self.backend = weights.backend
        self.kv_type = GGMLType(kv_type)
        with released_on_error(weights):
            weights.file.check_kind(KIND, version=FORMAT_VERSION)
            self.config = RealtimeConfig.from_gguf(weights.file)
            self.w = RealtimeWeights.from_tensors(weights.require(self.config.tensor_shapes()),
                                                  self.config)
            self.tokenizer_json = weights.file.get(TOKENIZER_KEY)

    def make_backbone(self, capacity: int, *, streams: int | None = None) -> DecodeSession:
        """A backbone decode session of `capacity` rows (with `streams`: shared by up to that
        many sequences); variant True = the last row's hidden, False = every row's."""
        lc = self.config.language_config
        session = DecodeSession if streams is None else SharedDecodeSession
        return session(
            lambda g, n, kv, last: build_backbone(g, self.w, self.config, n, kv, bool(last)),
            backend=self.backend, n_layer=lc.num_hidden_layers, n_kv_head=lc.num_key_value_heads,
            head_dim=lc.head_dim, capacity=capacity, prefix="backbone", name="realtime",
            dtype=self.kv_type)

    def make_local(self, *, streams: int | None = None) -> DecodeSession:
        """The per-frame local session: one replayed step graph per position j (the variant);
        with `streams`, shared by that many (a step carries one row per stream)."""
        lc = self.config.local_config
        session = DecodeSession if streams is None else SharedDecodeSession
        return session(
            lambda g, n, kv, j: build_local_step(g, self.w, self.config, kv, j, n),
            backend=self.backend, n_layer=lc.num_hidden_layers, n_kv_head=lc.num_key_value_heads,
            head_dim=lc.head_dim, capacity=frames_capacity(self.config.rvq, streams), prefix="local",
            name="realtime.local", dtype=F32)

    def draw_frames(self, local_run, hidden: np.ndarray, turns: list[TurnSampler]) -> np.ndarray:
        """A frame for each of n streams from their backbone hiddens (n, H) → codes (n, rvq):
        position j's head draws code j of every stream (each by its own turn, over its own
        history), which feeds position j + 1. `local_run(j, feed)` runs local position j over
        the n rows → their logits (n, audio_vocab_size)."""
        seen = [turn.seen() for turn in turns]
        codes = np.empty((len(turns), self.config.rvq), dtype=np.int64)
        feed = {"local.h": np.asarray(hidden, np.float32).reshape(len(turns), -1)}
        for j in range(self.config.rvq):
            logits = local_run(j, feed)
            codes[:, j] = [turn.choose(j, logits[i], seen[i]) for i, turn in enumerate(turns)]
            feed = {"local.code": codes[:, j].astype(np.int32)}
        return codes

    def sample_frame(self, local: DecodeSession, hidden: np.ndarray,
                     turn: TurnSampler) -> np.ndarray:
        """One stream's frame [rvq] from its backbone hidden [H] (`draw_frames` of one row)."""
        local.reset()   # every frame is a fresh local sequence at positions 0..rvq−1
        return self.draw_frames(lambda j, feed: local.run(feed, 1, variant=j)["local.logits"],
                                hidden, [turn])[0]

    def batch_frames(self, local: SharedDecodeSession, hidden: np.ndarray,
                     turns: list[TurnSampler]) -> np.ndarray:
        """`draw_frames` for the streams of a shared local session, every position one graph
        over their rows (each stream's local sequence starts afresh each frame)."""
        run, every = local.per_frame(len(turns), self.config.rvq), list(range(len(turns)))
        return self.draw_frames(lambda j, feed: run(feed, every, j)["local.logits"], hidden,
                                turns)

    def prefill_stream(self, backbone: SharedDecodeSession, seq: int, rows) -> np.ndarray:
        """`FrameStream.feed` for sequence `seq` of a shared backbone → its last row's hidden."""
        rows = check_rows(rows, self.config)
        return backbone.prefill_sequence(seq, row_feed(rows), len(rows),
                                         variant=True)[-1]["hidden"][0]

    def step_hidden(self, backbone: SharedDecodeSession, seqs, rows) -> np.ndarray:
        """One row per sequence of a shared backbone (rows (n, 1 + rvq), row i of seqs[i]) →
        each row's hidden (n, H), one graph over all of them."""
        return backbone.step(seqs, row_feed(check_rows(rows, self.config)),
                             variant=False)["hidden"]

    def forward(self, rows) -> np.ndarray:
        """rows [S, 1 + rvq] → the backbone's post-norm hidden states [S, H]."""
        rows = check_rows(rows, self.config)
        with self.make_backbone(len(rows)) as session:
            outs = session.prefill(row_feed(rows), len(rows), variant=False)
        return concat_rows(outs)["hidden"]

    def local_logits(self, hidden_row, codes) -> np.ndarray:
        """Teacher-forced local pass: hidden [H] and a frame's codes [rvq] → logits
        [rvq, audio_vocab_size], row j from head j after codes 0..j−1."""
        cfg = self.config
        hidden = np.asarray(hidden_row, dtype=np.float32).reshape(-1)
        codes = np.asarray(codes).reshape(-1)
        if hidden.shape != (cfg.language_config.hidden_size,) or len(codes) != cfg.rvq \
                or codes.dtype.kind not in "iu" or codes.min() < 0 \
                or codes.max() >= cfg.audio_vocab_size:
            raise InputError(f"local_logits takes a hidden row [{cfg.language_config.hidden_size}]"
                             f" and {cfg.rvq} integer codes in [0, {cfg.audio_vocab_size})")
        out = np.empty((cfg.rvq, cfg.audio_vocab_size), dtype=np.float32)
        with self.make_local() as local:
            feed = {"local.h": hidden.reshape(1, -1)}
            for j in range(cfg.rvq):
                out[j] = local.run(feed, 1, variant=j)["local.logits"][0]
                feed = {"local.code": np.array([codes[j]], dtype=np.int32)}
        return out

    def stream(self, capacity: int, *, options: RealtimeSamplingOptions = RealtimeSamplingOptions(),
               seed: int | None = None) -> FrameStream:
        return FrameStream(self, capacity, options, seed)

    def generate(self, rows, text_ids=(), *,
                 options: RealtimeSamplingOptions = RealtimeSamplingOptions(),
                 seed: int | None = None, max_frames: int = MAX_FRAMES) -> np.ndarray:
        """Prompt rows (ending on the lead rows, BOS on the last) and the text ids still to come
        → frames [N, rvq] before the first EOS (upstream returns them unsanitized too)."""
        return np.array(list(self.iter_frames(rows, text_ids, options=options, seed=seed,
                                              max_frames=max_frames)),
                        dtype=np.int64).reshape(-1, self.config.rvq)

    def iter_frames(self, rows, text_ids=(), *,
                    options: RealtimeSamplingOptions = RealtimeSamplingOptions(),
                    seed: int | None = None, max_frames: int = MAX_FRAMES):
        """Frames as they are generated (the generator of `generate`): after the prompt one
        frame per text id, then `<|text_pad|>` rows until EOS or max_frames."""
        rows = check_rows(rows, self.config)
        turn = TurnSampler(self.config, options, np.random.default_rng(seed), text_ids,
                           max_frames)
        with self.stream(len(rows) + max_frames, options=options, seed=seed) as s:
            frame = s.start(rows, turn)
            while not turn.finished:      # the EOS frame is not returned
                yield frame
                if not turn.going:
                    return
                frame = s.step(turn.next_text())

    def close(self) -> None:
        if getattr(self, "weights", None) is not None:
            self.weights.close()
            self.weights = None
