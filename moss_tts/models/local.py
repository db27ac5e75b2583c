"""MossTTSLocal (MOSS-TTS-Local-Transformer, 1.7B): a Qwen3 backbone over rows of 1 text + n_vq
audio channels without delay, and per frame a 4-layer depth transformer over the 33 channels
(upstream `moss_tts_local/modeling_moss_tts.py`; docs/upstream-notes.md §family-3).

A row embeds as embedding_list.0[text] + Σ_{k<n} embedding_list.{k+1}[code_k], n =
n_vq_for_inference (the pad rows are padding_idx rows, added like any other, P1). Per frame the
backbone's last hidden g seeds the depth sequence u_0 = MLP_in(g); position c's output goes
through MLP_out_c, RMSNorm_c and head c (c = 0: the text vocabulary), and the token chosen
there comes back as u_{c+1} = MLP_in(embedding_list.c[token]) — the text token through the text
table (P7-P9).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import ConfigError, InputError
from ..ggml import F16, F32, I32, GGMLType, Graph, Weights, ops
from ..ggml.backend import released_on_error
from ..ggml.graph import Tensor
from ..nn import CacheView, last_row, mlp, rms_norm
from ..nn.session import (DecodeSession, SessionsOwner, SharedDecodeSession, concat_rows,
                          frames_capacity)
from ..sampling import LocalSamplingOptions, check_finite, choose_rows, seen_per_head
from . import qwen3, spec
from .rows import check_ids, check_rows

KIND = "local"
FORMAT_VERSION = 1
PREFIX = "moss.local"
TOKENIZER_KEY = "moss.tokenizer.json"
TEXT_EMBED = "token_embd.weight"       # embedding_list.0 under its llama.cpp name
TEXT_HEAD = "output.weight"            # lm_heads.0 (absent when tied to the text table)
LOCAL = "local."                       # the depth transformer's blocks: local.blk.<i>.*
IN_MLP = "speech_embedding_to_local_mlp."
OUT_MLP = "local_to_speech_embedding_mlps.{}."
HEAD_NORM = "layer_norm_before_lm_heads.{}.weight"
AUDIO_HEAD = "lm_heads.{}.weight"      # c = 1..n_vq
AUDIO_EMBED = "embedding_list.{}.weight"
SWIGLU = ("gate_proj", "up_proj", "down_proj")
# Generation budget in frames (P25): upstream's README passes max_new_tokens=4096
MAX_NEW_FRAMES = 4096


@dataclass(frozen=True)
class LocalConfig:
    """Field names and defaults of upstream `MossTTSDelayConfig` of moss_tts_local (§family-3.1)."""

    language_config: qwen3.Qwen3Config
    vocab_size: int
    n_vq: int = 32
    audio_vocab_size: int = 1024
    local_num_layers: int = 4
    local_hidden_size: int = 1536
    local_ffn_hidden_size: int = 8960
    additional_mlp_ffn_hidden_size: int = 2048
    pad_token_id: int = qwen3.PAD_ID
    im_start_token_id: int = qwen3.IM_START_ID
    im_end_token_id: int = qwen3.IM_END_ID
    audio_user_slot_token_id: int = qwen3.AUDIO_USER_SLOT_ID
    audio_assistant_gen_slot_token_id: int = qwen3.AUDIO_ASSISTANT_SLOT_ID
    audio_start_token_id: int = qwen3.AUDIO_START_ID
    audio_end_token_id: int = qwen3.AUDIO_END_ID
    audio_pad_code: int = 1024
    sampling_rate: int = 24000
    tie_text_head: int = 0       # 1: lm_heads.0 is embedding_list.0, stored once

    def __post_init__(self):
        check_ids(self, "Local")
        if self.n_vq < 1 or self.local_num_layers < 1:
            raise ConfigError(f"Local: n_vq {self.n_vq} and local_num_layers "
                              f"{self.local_num_layers} must be at least 1")

    @property
    def audio_rows(self) -> int:
        """Rows of each audio table and head: the codebook plus the pad code."""
        return self.audio_vocab_size + 1

    @property
    def local_config(self) -> qwen3.Qwen3Config:
        """The depth transformer: the backbone's attention geometry (heads, kv heads, head_dim —
        so q width ≠ hidden, P7) with its own width, depth and FFN, as upstream deep-copies."""
        return replace(self.language_config, hidden_size=self.local_hidden_size,
                       num_hidden_layers=self.local_num_layers,
                       intermediate_size=self.local_ffn_hidden_size)

    @classmethod
    def from_gguf(cls, meta) -> "LocalConfig":
        return spec.config_from_gguf(cls, meta, PREFIX,
                                     language_config=qwen3.Qwen3Config.from_gguf(meta))

    def to_metadata(self) -> dict:
        return spec.config_to_metadata(self, PREFIX) | self.language_config.to_metadata()

    def tensor_shapes(self) -> dict[str, tuple]:
        d, n, a = self.language_config.hidden_size, self.n_vq, self.audio_rows
        loc, f = self.local_hidden_size, self.additional_mlp_ffn_hidden_size
        shapes = {TEXT_EMBED: (self.vocab_size, d)}
        if not self.tie_text_head:
            shapes[TEXT_HEAD] = (self.vocab_size, d)
        shapes |= self.language_config.tensor_shapes()
        shapes |= {AUDIO_EMBED.format(k): (a, d) for k in range(1, n + 1)}
        shapes |= {AUDIO_HEAD.format(k): (a, d) for k in range(1, n + 1)}
        shapes |= {LOCAL + k: s for k, s in self.local_config.tensor_shapes().items()}
        shapes |= swiglu_shapes(IN_MLP, d, f, loc)
        for c in range(n + 1):
            shapes |= swiglu_shapes(OUT_MLP.format(c), loc, f, d)
            shapes[HEAD_NORM.format(c)] = (d,)
        return shapes


def swiglu_shapes(prefix: str, d_in: int, d_ff: int, d_out: int) -> dict[str, tuple]:
    """An upstream MossTTSMLP: gate and up (d_ff, d_in), down (d_out, d_ff), no bias (P8)."""
    return {f"{prefix}gate_proj.weight": (d_ff, d_in), f"{prefix}up_proj.weight": (d_ff, d_in),
            f"{prefix}down_proj.weight": (d_out, d_ff)}


@dataclass(frozen=True)
class SwiGLU:
    gate: Tensor
    up: Tensor
    down: Tensor

    @classmethod
    def from_tensors(cls, t: dict, prefix: str) -> "SwiGLU":
        return cls(*(t[f"{prefix}{n}.weight"] for n in SWIGLU))

    def __call__(self, x: Tensor) -> Tensor:
        return mlp(x, self.up, self.down, activation="silu", w_gate=self.gate)


@dataclass(frozen=True)
class LocalWeights:
    tables: list[Tensor]               # embedding_list.0 (text) … n_vq
    layers: list[qwen3.Qwen3Layer]
    output_norm: Tensor
    heads: list[Tensor]                # lm_heads.0 (text; the text table when tied) … n_vq
    local_layers: list[qwen3.Qwen3Layer]
    local_norm: Tensor
    in_mlp: SwiGLU
    out_mlps: list[SwiGLU]
    head_norms: list[Tensor]

    @classmethod
    def from_tensors(cls, t: dict, cfg: LocalConfig) -> "LocalWeights":
        n = cfg.n_vq
        local = {k[len(LOCAL):]: v for k, v in t.items() if k.startswith(LOCAL)}
        return cls([t[TEXT_EMBED]] + [t[AUDIO_EMBED.format(k)] for k in range(1, n + 1)],
                   qwen3.layers_from_tensors(t, cfg.language_config), t["output_norm.weight"],
                   [t[TEXT_EMBED if cfg.tie_text_head else TEXT_HEAD]]
                   + [t[AUDIO_HEAD.format(k)] for k in range(1, n + 1)],
                   qwen3.layers_from_tensors(local, cfg.local_config), local["output_norm.weight"],
                   SwiGLU.from_tensors(t, IN_MLP),
                   [SwiGLU.from_tensors(t, OUT_MLP.format(c)) for c in range(n + 1)],
                   [t[HEAD_NORM.format(c)] for c in range(n + 1)])


# -- host-side inputs -------------------------------------------------------------------------
def check_n_vq(n_vq: int | None, cfg: LocalConfig) -> int:
    """n_vq_for_inference: None = all; 1..n_vq codebooks are generated (variable bitrate)."""
    if n_vq is None:
        return cfg.n_vq
    if isinstance(n_vq, bool) or not float(n_vq).is_integer() or not 1 <= n_vq <= cfg.n_vq:
        raise InputError(f"n_vq_for_inference must be a whole number in 1..{cfg.n_vq}, "
                         f"got {n_vq}")
    return int(n_vq)


def row_feed(rows: np.ndarray, n_vq: int) -> dict[str, np.ndarray]:
    rows = rows.astype(np.int32)
    return {f"rows.{c}": rows[:, c] for c in range(n_vq + 1)}


# -- graph builders ---------------------------------------------------------------------------
def build_rows(g: Graph, w: LocalWeights, cfg: LocalConfig, n_rows: int, kv: CacheView,
               n_vq: int, last_only: bool) -> None:
    """Rows → "hidden" [H, R] (R = 1, the last row, or every row): the sum of the text and the
    first n_vq audio embeddings (upstream embeds only n_vq_for_inference channels) through the
    backbone."""
    x = ops.get_rows(w.tables[0], g.input("rows.0", (n_rows,), I32))
    for c in range(1, n_vq + 1):
        x = x + ops.get_rows(w.tables[c], g.input(f"rows.{c}", (n_rows,), I32))
    h = qwen3.forward(x, w.layers, w.output_norm, cfg.language_config, kv=kv)
    g.output(last_row(h) if last_only else h, "hidden", ndim=2)


def build_depth_step(g: Graph, w: LocalWeights, cfg: LocalConfig, kv: CacheView, p: int,
                     n_rows: int = 1) -> None:
    """Depth position p of a frame (§family-3.4) for n_rows streams (one row each): input
    MLP_in(g) (p = 0, "depth.h" (n_rows, H)) or MLP_in(embedding_list.{p−1}[token]) (p ≥ 1,
    "depth.token"); one step of the causal, RoPE-free depth stack over the frame's cache; out
    "depth.logits" (n_rows, V_p) of head p only (RMSNorm_p(MLP_out_p(h)) · lm_heads.p)."""
    d = cfg.language_config.hidden_size
    if p == 0:
        x = g.input("depth.h", (n_rows, d))
    else:   # the token chosen at position p − 1, the text token through the text table
        x = ops.get_rows(w.tables[p - 1], g.input("depth.token", (n_rows,), I32))
    h = qwen3.forward(w.in_mlp(x), w.local_layers, w.local_norm, cfg.local_config, kv=kv,
                      stage="depth", rope_mode=None)
    y = rms_norm(w.out_mlps[p](h), w.head_norms[p], eps=cfg.language_config.rms_norm_eps)
    g.output(ops.mul_mat(w.heads[p], y), "depth.logits", ndim=2)


# -- sampling one channel ---------------------------------------------------------------------
def choose(logits: np.ndarray, c: int, seen: np.ndarray, cfg: LocalConfig,
           opts: LocalSamplingOptions, rng) -> int:
    """Channel c's token, HF order (§family-3.6): pad −inf (audio), then what `opts` says for the
    channel — sampled: the repetition penalty over its own prompt + generated history (audio
    only), temperature → top-k → top-p → draw; greedy: the plain argmax (upstream's `_sample`
    runs no processor on a do_sample=False channel, not even the penalty)."""
    check_finite(logits, "text" if c == 0 else "audio")
    scores = logits.astype(np.float64)[None]
    if c == 0:
        return int(choose_rows(scores, rng, opts.text_channel)[0])
    scores[0, cfg.audio_pad_code] = -np.inf
    return int(choose_rows(scores, rng, opts.audio_channel, seen[c - 1:c])[0])


class RowChooser:
    """One utterance's choices: its generator (seeded per utterance), each channel's repetition
    history (prompt codes + generated, §family-3.6), and when it ends: the audio_end row or its
    budget. Shared by `LocalModel.iter_rows` and the batched decode (models/local_decode.py),
    so a stream makes the same draws alone or among others."""

    def __init__(self, cfg: LocalConfig, rows: np.ndarray, options: LocalSamplingOptions,
                 seed: int | None, max_new_frames: int):
        self.cfg, self.options, self.max_new_frames = cfg, options, max_new_frames
        self.rng = np.random.default_rng(seed)
        # per-channel history, prompt included (HF RepetitionPenaltyLogitsProcessor, §family-3.6)
        self.seen = seen_per_head(rows[:, 1:], cfg.audio_rows)
        self.n_rows = 0

    def choose(self, c: int, logits: np.ndarray) -> int:
        return choose(logits, c, self.seen, self.cfg, self.options, self.rng)

    def accept(self, row: np.ndarray) -> bool:
        """Record a generated row; False when the utterance ends with it."""
        self.seen |= seen_per_head(row[None, 1:], self.cfg.audio_rows)
        self.n_rows += 1
        return row[0] != self.cfg.audio_end_token_id and self.n_rows < self.max_new_frames


# -- the runtime ------------------------------------------------------------------------------
class GenerationState(SessionsOwner):
    """Per-utterance state owned by the caller (style C16): the backbone's decode session and
    the per-frame depth session (one replayed step graph per depth position). A context
    manager, like every owner of native memory (C10). With `streams`, both sessions are shared
    by up to that many streams (`SharedDecodeSession`), a step carrying one row per stream."""

    SESSIONS = ("backbone", "depth")

    def __init__(self, model: "LocalModel", capacity: int, *, streams: int | None = None):
        cfg, lc, loc = model.config, model.config.language_config, model.config.local_config
        w = model.w
        self.capacity = capacity  # rows this state accepts
        # variant (n_vq_for_inference, last row only); a batched step returns every row
        session = DecodeSession if streams is None else SharedDecodeSession
        self.backbone = session(
            lambda g, n, kv, variant: build_rows(g, w, cfg, n, kv, *variant),
            backend=model.backend, n_layer=lc.num_hidden_layers,
            n_kv_head=lc.num_key_value_heads, head_dim=lc.head_dim, capacity=capacity,
            prefix="backbone", name="local", dtype=model.kv_type)
        # ≤ n_vq + 1 positions, exact in f32: upstream recomputes the whole prefix (§family-3.4)
        with released_on_error(self.backbone):
            self.depth = session(
                lambda g, n, kv, p: build_depth_step(g, w, cfg, kv, p, n), backend=model.backend,
                n_layer=loc.num_hidden_layers, n_kv_head=loc.num_key_value_heads,
                head_dim=loc.head_dim, capacity=frames_capacity(cfg.n_vq + 1, streams),
                prefix="depth", name="local.depth", dtype=F32)


class LocalModel:
    """MossTTSLocal on a backend; stateless after load (style C16). `kv_type` is the backbone
    cache's (F16 halves it; F32 keeps attention exact to f32 rounding)."""

    def __init__(self, weights: Weights, *, kv_type: GGMLType = F16):
        self.weights = weights
        self.backend = weights.backend
        self.kv_type = GGMLType(kv_type)
        with released_on_error(weights):
            weights.file.check_kind(KIND, version=FORMAT_VERSION)
            self.config = LocalConfig.from_gguf(weights.file)
            self.tokenizer_json = weights.file.get(TOKENIZER_KEY)
            self.w = LocalWeights.from_tensors(weights.require(self.config.tensor_shapes()),
                                               self.config)

    def make_state(self, capacity: int, *, streams: int | None = None) -> GenerationState:
        """With `streams`, both sessions are shared by up to that many streams (models/
        local_decode.py): `capacity` backbone rows in all."""
        return GenerationState(self, capacity, streams=streams)

    # -- research API ---------------------------------------------------------------------
    def forward(self, rows, *, n_vq_for_inference: int | None = None) -> np.ndarray:
        """rows [S, 1 + n_vq] → the backbone's post-norm hidden states [S, H]."""
        rows = check_rows(rows, self.config)
        n = check_n_vq(n_vq_for_inference, self.config)
        with self.make_state(len(rows)) as state:
            outs = state.backbone.prefill(row_feed(rows, n), len(rows), variant=(n, False))
        return concat_rows(outs)["hidden"]

    def depth_logits(self, hidden_row, row) -> tuple[np.ndarray, np.ndarray]:
        """The frame's per-channel logits with `row` [1..1 + n_vq] teacher-forced: hidden_row
        [H] (the backbone's, for the frame) → (text logits [V] of position 0, audio logits
        [len(row) − 1, audio_rows] of positions 1.., the pad column −inf)."""
        cfg = self.config
        row = np.asarray(row).reshape(-1)
        if not 1 <= len(row) <= cfg.n_vq + 1 or row.dtype.kind not in "iu":
            raise InputError(f"row must hold 1..{cfg.n_vq + 1} integer tokens, got {row.shape}")
        check_rows(np.concatenate([row, np.zeros(cfg.n_vq + 1 - len(row), row.dtype)])[None],
                   cfg)
        with self.make_state(1) as state:
            out = [self.depth_step(state, 0, hidden_row)]
            out += [self.depth_step(state, p, int(row[p - 1])) for p in range(1, len(row))]
        audio = np.array(out[1:], dtype=np.float32).reshape(-1, cfg.audio_rows)
        audio[:, cfg.audio_pad_code] = -np.inf
        return out[0], audio

    def depth_feed(self, p: int, values) -> dict[str, np.ndarray]:
        """Host inputs of depth position p for one row per stream: values are the backbone
        hiddens (n, H) at p = 0, the tokens chosen at position p − 1 after."""
        if p == 0:
            h = self.config.language_config.hidden_size
            return {"depth.h": np.asarray(values, np.float32).reshape(-1, h)}
        return {"depth.token": np.asarray(values, np.int32).reshape(-1)}

    def depth_step(self, state: GenerationState, p: int, value) -> np.ndarray:
        """Depth position p of the current frame: value is the backbone hidden [H] (p = 0,
        which starts a fresh depth sequence) or the token chosen at p − 1. → head p's logits."""
        if not 0 <= p <= self.config.n_vq:
            raise InputError(f"depth position {p} is outside 0..{self.config.n_vq}")
        if p == 0:
            state.depth.reset()   # every frame is a fresh local sequence
        if state.depth.position != p:
            raise InputError(f"depth position {p} follows position {state.depth.position - 1}; "
                             "a frame's positions run 0, 1, 2, … in order")
        return state.depth.run(self.depth_feed(p, value), 1, variant=p)["depth.logits"][0]

    def frame(self, state: GenerationState, h: np.ndarray, n_vq: int, choose_token) -> np.ndarray:
        """One row [1 + n_vq] from the backbone hidden h: positions 0..n_vq, each token chosen
        by `choose_token(channel, logits)` and fed to the next position; channels past n_vq
        are 0, as upstream fills them (P9)."""
        return self.frame_rows(lambda p, values, _: self.depth_step(state, p, values[0])[None],
                               np.asarray(h)[None], [n_vq],
                               lambda _, c, logits: choose_token(c, logits))[0]

    def frame_rows(self, depth_run, h: np.ndarray, n_vqs: list[int], choose_token) -> np.ndarray:
        """One row [1 + n_vq] for each of k streams from their backbone hiddens h (k, H):
        stream i fills positions 0..n_vqs[i] (channels past them 0, P9), each token chosen by
        `choose_token(i, channel, logits)` and fed to the stream's next position.
        `depth_run(p, values, streams)` runs depth position p for the listed streams (one row
        each) and returns their logits in that order. → rows (k, 1 + n_vq)."""
        rows = np.zeros((len(h), self.config.n_vq + 1), dtype=np.int64)
        for p in range(max(n_vqs) + 1):
            streams = [i for i, n in enumerate(n_vqs) if n >= p]
            logits = depth_run(p, h if p == 0 else rows[streams, p - 1], streams)
            for j, i in enumerate(streams):
                rows[i, p] = choose_token(i, p, logits[j])
        return rows

    def batch_rows(self, state: GenerationState, h: np.ndarray, n_vqs: list[int],
                   choose_token) -> np.ndarray:
        """`frame_rows` for the streams of a shared state, every depth position one graph over
        their rows (the depth sequences start afresh each frame)."""
        run = state.depth.per_frame(len(h), self.config.n_vq + 1)
        return self.frame_rows(lambda p, values, streams: run(
            self.depth_feed(p, values), streams, p)["depth.logits"], h, n_vqs, choose_token)

    # -- generation -----------------------------------------------------------------------
    def generate(self, rows, **kwargs) -> np.ndarray:
        """Prompt rows → the new rows [N, 1 + n_vq], the audio-end row included (its codes are
        a real trailing frame, P9). Keywords as `iter_rows`."""
        return np.array(list(self.iter_rows(rows, **kwargs)),
                        dtype=np.int64).reshape(-1, self.config.n_vq + 1)

    def iter_rows(self, rows, *, options: LocalSamplingOptions = LocalSamplingOptions(),
                  seed: int | None = None, max_new_frames: int = MAX_NEW_FRAMES,
                  n_vq_for_inference: int | None = None):
        """Rows as they are generated (the generator of `generate`); stops after the row whose
        text token is audio_end (151653), or after max_new_frames rows."""
        cfg = self.config
        rows = check_rows(rows, cfg)
        n = check_n_vq(n_vq_for_inference, cfg)
        if max_new_frames < 1:
            raise InputError(f"max_new_frames must be at least 1, got {max_new_frames}")
        chooser = RowChooser(cfg, rows, options, seed, max_new_frames)
        with self.make_state(len(rows) + max_new_frames) as state:
            feed = rows
            while True:
                h = state.backbone.prefill(row_feed(feed, n), len(feed),
                                           variant=(n, True))[-1]["hidden"]
                row = self.frame(state, h[0], n, chooser.choose)
                going = chooser.accept(row)
                yield row
                if not going:
                    return
                feed = row[None]

    def close(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None
