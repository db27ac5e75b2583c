"""MOSS-TTS-Nano: a global GPT-2 over prompt/frame rows and a 1-layer local (depth) transformer
that emits one frame's 16 codes (upstream `MossTTSNanoForCausalLM`; docs/upstream-notes.md
§nano-1-4).

A row is [text id, code_0 … code_15]; its embedding is wte[text] + Σ_c audio_embeddings[c][code_c]
with pad codes contributing nothing. Heads are tied: the text head is wte (only the continue/stop
rows are ever needed) and audio head c is audio_embeddings[c].
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..errors import ConfigError, InputError
from ..ggml import I32, Graph, Weights, ops
from ..ggml.backend import released_on_error
from ..ggml.graph import Tensor
from ..nn import CacheView, last_row, masked_embedding_sum
from ..nn.session import DecodeSession, SessionsOwner, SharedDecodeSession, frames_capacity
from . import gpt2, spec
from .rows import masked_row_feed

KIND = "nano"
FORMAT_VERSION = 1
PREFIX = "moss.nano"
TOKENIZER_KEY = "moss.tokenizer.sentencepiece"
GLOBAL, LOCAL = "transformer", "local_transformer"


@dataclass(frozen=True)
class NanoConfig:
    backbone: gpt2.GPT2Config          # the global transformer
    local: gpt2.GPT2Config             # the depth transformer (same widths, fewer layers)
    vocab_size: int
    n_vq: int
    audio_vocab_size: int
    audio_pad_token_id: int
    pad_token_id: int
    im_start_token_id: int
    im_end_token_id: int
    audio_start_token_id: int
    audio_end_token_id: int
    audio_user_slot_token_id: int
    audio_assistant_slot_token_id: int
    sample_rate: int = 48000

    def __post_init__(self):
        ids = [f.name for f in fields(self) if f.type == "int"]   # token ids and sizes
        if not 1 <= self.n_vq <= 1024 or not all(0 <= getattr(self, k) < 1 << 24 for k in ids):
            raise ConfigError(f"Nano: n_vq {self.n_vq} or a token id / size is out of range "
                              "(a corrupt file?)")
        if self.local.n_embd != self.backbone.n_embd:
            raise ConfigError("Nano: the local transformer must have the global width")
        if self.audio_pad_token_id < self.audio_vocab_size:
            raise ConfigError(f"Nano: audio pad id {self.audio_pad_token_id} lies inside the "
                              f"codebooks (size {self.audio_vocab_size})")

    @classmethod
    def from_gguf(cls, meta) -> "NanoConfig":
        return spec.config_from_gguf(cls, meta, PREFIX,
                                     backbone=gpt2.GPT2Config.from_gguf(meta, f"{PREFIX}.global"),
                                     local=gpt2.GPT2Config.from_gguf(meta, f"{PREFIX}.local"))

    def to_metadata(self) -> dict:
        return (spec.config_to_metadata(self, PREFIX)
                | spec.config_to_metadata(self.backbone, f"{PREFIX}.global")
                | spec.config_to_metadata(self.local, f"{PREFIX}.local"))

    def tensor_shapes(self) -> dict[str, tuple]:
        d = self.backbone.n_embd
        shapes = {f"{GLOBAL}.wte.weight": (self.vocab_size, d), f"{GLOBAL}.ln_f.weight": (d,),
                  f"{GLOBAL}.ln_f.bias": (d,), f"{LOCAL}.ln_f.weight": (d,),
                  f"{LOCAL}.ln_f.bias": (d,)}
        for prefix, c in ((GLOBAL, self.backbone), (LOCAL, self.local)):
            for i in range(c.n_layer):
                shapes |= spec.shapes(c.layer_spec(), f"{prefix}.h.{i}.")
        shapes.update({f"audio_embeddings.{c}.weight": (self.audio_vocab_size, d)
                       for c in range(self.n_vq)})
        return shapes


@dataclass(frozen=True)
class NanoWeights:
    wte: Tensor
    layers: list[gpt2.GPT2Layer]
    ln_f: tuple[Tensor, Tensor]
    local_layers: list[gpt2.GPT2Layer]
    local_ln_f: tuple[Tensor, Tensor]
    audio_embeddings: list[Tensor]     # input tables, and (tied) the audio heads

    @classmethod
    def from_weights(cls, w: Weights, cfg: NanoConfig) -> "NanoWeights":
        t = w.require(cfg.tensor_shapes(), floats=True)
        return cls(wte=t[f"{GLOBAL}.wte.weight"],
                   layers=[gpt2.GPT2Layer.from_tensors(t, f"{GLOBAL}.h.{i}.", cfg.backbone)
                           for i in range(cfg.backbone.n_layer)],
                   ln_f=(t[f"{GLOBAL}.ln_f.weight"], t[f"{GLOBAL}.ln_f.bias"]),
                   local_layers=[gpt2.GPT2Layer.from_tensors(t, f"{LOCAL}.h.{i}.", cfg.local)
                                 for i in range(cfg.local.n_layer)],
                   local_ln_f=(t[f"{LOCAL}.ln_f.weight"], t[f"{LOCAL}.ln_f.bias"]),
                   audio_embeddings=[t[f"audio_embeddings.{c}.weight"] for c in range(cfg.n_vq)])


# -- graph builders ---------------------------------------------------------------------------
def embed_rows(g: Graph, w: NanoWeights, cfg: NanoConfig, n_rows: int) -> Tensor:
    """[D, n_rows]: wte[text] + Σ_c mask_c · audio_embeddings[c][code_c] (no position table)."""
    text = g.input("rows.text", (n_rows,), I32)
    ids = [g.input(f"rows.code.{c}", (n_rows,), I32) for c in range(cfg.n_vq)]
    masks = [g.input(f"rows.mask.{c}", (n_rows, 1)) for c in range(cfg.n_vq)]
    return ops.add(ops.get_rows(w.wte, text), masked_embedding_sum(w.audio_embeddings, ids, masks))


def build_global_step(g: Graph, w: NanoWeights, cfg: NanoConfig, n_rows: int,
                      kv: CacheView, *, every_row: bool = False) -> None:
    """Rows → the hidden state of the last row ("global.hidden" [D]), caching every row's K/V;
    `every_row`: of each row, [D, n_rows] (a batched step: one row per stream)."""
    x = embed_rows(g, w, cfg, n_rows)
    h = gpt2.forward(x, w.layers, w.ln_f, cfg.backbone, kv=kv, stage="global")
    if every_row:
        g.output(h, "global.hidden", ndim=2)
    else:
        g.output(last_row(h), "global.hidden", ndim=1)


def build_depth_step(g: Graph, w: NanoWeights, cfg: NanoConfig, kv: CacheView, p: int,
                     n_rows: int = 1) -> None:
    """Local position p of a frame (docs/upstream-notes.md §nano-3) for n_rows streams (one row
    each): input h (p = 0), wte[decision] (p = 1) or audio_embeddings[p−2][code] (p ≥ 2); output
    the text decision logits (n_rows, 2) (p = 0: rows continue, stop of the tied text head) or
    audio head p−1's logits (n_rows, audio_vocab)."""
    d = cfg.local.n_embd
    if p == 0:
        x = g.input("depth.h", (n_rows, d))
    elif p == 1:
        x = ops.get_rows(w.wte, g.input("depth.token", (n_rows,), I32))
    else:
        x = ops.get_rows(w.audio_embeddings[p - 2], g.input("depth.code", (n_rows,), I32))
    h = gpt2.forward(x, w.local_layers, w.local_ln_f, cfg.local, kv=kv, stage="depth")
    if p == 0:
        # only the continue/stop rows of the text head are ever used: 2 rows, not the vocabulary
        heads = ops.get_rows(w.wte, g.input("depth.decision_ids", (2,), I32))
        g.output(ops.mul_mat(heads, h), "depth.logits", ndim=2)
    else:
        g.output(ops.mul_mat(w.audio_embeddings[p - 1], h), "depth.logits", ndim=2)


# -- the runtime ------------------------------------------------------------------------------
class GenerationState(SessionsOwner):
    """Per-utterance state owned by the caller (style C16): the global decode session sized for
    the prompt plus the frame budget, and the per-frame depth session (one replayed step graph
    per local position). A context manager, like every owner of native memory (C10).

    With `streams`, both sessions are shared by up to that many streams (`SharedDecodeSession`:
    `capacity` rows in all), and a step carries one row per stream (`NanoModel.step_hidden`,
    `NanoModel.frames`); the global step graphs are the "step" variant, which returns every row.
    """

    SESSIONS = ("global_", "depth")

    def __init__(self, model: "NanoModel", capacity: int, *, streams: int | None = None):
        cfg, b, loc = model.config, model.config.backbone, model.config.local
        w = model.w
        self.capacity = capacity  # rows this state accepts
        session = DecodeSession if streams is None else SharedDecodeSession
        self.global_ = session(
            lambda g, n, kv, v: build_global_step(g, w, cfg, n, kv, every_row=v == "step"),
            backend=model.backend, n_layer=b.n_layer, n_kv_head=b.n_head, head_dim=b.head_dim,
            capacity=capacity, prefix="global", name="nano.global", head_major=True)
        with released_on_error(self.global_):
            self.depth = session(
                lambda g, n, kv, p: build_depth_step(g, w, cfg, kv, p, n), backend=model.backend,
                n_layer=loc.n_layer, n_kv_head=loc.n_head, head_dim=loc.head_dim,
                capacity=frames_capacity(cfg.n_vq + 1, streams), prefix="depth", name="nano.depth",
                head_major=True)

    @property
    def position(self) -> int:
        return self.global_.position

    def reset(self) -> None:
        """Empty the caches for a new utterance; the built graphs stay valid (same caches)."""
        self.global_.reset()
        self.depth.reset()



class NanoModel:
    """The Nano transformer pair on a backend; stateless after load (style C16)."""

    def __init__(self, weights: Weights):
        self.weights = weights
        self.backend = weights.backend
        with released_on_error(weights):
            weights.file.check_kind(KIND, version=FORMAT_VERSION)
            self.config = NanoConfig.from_gguf(weights.file)
            self.w = NanoWeights.from_weights(weights, self.config)
        self.decision_ids = np.array([self.config.audio_assistant_slot_token_id,
                                      self.config.audio_end_token_id], dtype=np.int32)

    def make_state(self, capacity: int, *, streams: int | None = None) -> GenerationState:
        return GenerationState(self, capacity, streams=streams)

    def prefill(self, state: GenerationState, rows: np.ndarray) -> np.ndarray:
        """Run prompt rows (appended after what the state holds) → hidden of the last row [D]."""
        feed = masked_row_feed(rows, self.config)
        if state.position + len(rows) > state.capacity:
            raise InputError(f"{state.position} + {len(rows)} rows exceed the state's capacity "
                             f"of {state.capacity}; make a larger state")
        return state.global_.run(feed, len(rows))["global.hidden"]

    def depth_feed(self, p: int, values) -> dict[str, np.ndarray]:
        """Host inputs of local position p for one row per stream: values are the hiddens
        (n, D) at p = 0, the decision token at p = 1, the previous channel's code after."""
        if p == 0:
            return {"depth.h": np.asarray(values, np.float32).reshape(-1, self.config.local.n_embd),
                    "depth.decision_ids": self.decision_ids}
        return {"depth.token" if p == 1 else "depth.code": np.asarray(values, np.int32).reshape(-1)}

    def depth_logits(self, state: GenerationState, p: int, value) -> np.ndarray:
        """Local position p of the current frame: value is h (p = 0), the decision token (p = 1)
        or the previous channel's code (p ≥ 2). Returns that position's head logits."""
        if not 0 <= p <= self.config.n_vq:
            raise InputError(f"local position {p} is outside 0..{self.config.n_vq}")
        if p == 0:
            state.depth.reset()  # every frame is a fresh local sequence (positions from 0)
        if state.depth.position != p:
            raise InputError(f"local position {p} follows position {state.depth.position - 1}; "
                             "a frame's positions run 0, 1, 2, … in order")
        return state.depth.run(self.depth_feed(p, value), 1, variant=p)["depth.logits"][0]

    def frame(self, state: GenerationState, h: np.ndarray, choose_code, decide) -> np.ndarray | None:
        """One frame from the global hidden h: the continue/stop decision, then the n_vq codes
        (each chosen by `choose_code(channel, logits)`); None when the model stops."""
        return self.frames(lambda p, values, _: self.depth_logits(state, p, values[0])[None],
                           np.asarray(h)[None], lambda c, _, logits: [choose_code(c, logits[0])],
                           lambda _, a, b: decide(a, b))[0]

    def frames(self, depth_run, h: np.ndarray, choose_codes, decide) -> list[np.ndarray | None]:
        """One frame for each of n streams from their global hiddens h (n, D): each stream's
        continue/stop decision (`decide(i, continue, stop)`), then, for those that continue,
        the n_vq codes channel by channel (`choose_codes(channel, streams, logits)`: one code
        per listed stream from its row of logits, all rows in one call so that a batch can
        sample them together); None for a stream that stops. `depth_run(p, values, streams)`
        runs local position p for the listed streams (one row each) and returns their logits,
        in that order."""
        n = len(h)
        ell = depth_run(0, h, list(range(n)))
        going = [i for i in range(n) if decide(i, float(ell[i, 0]), float(ell[i, 1]))]
        codes = np.zeros((n, self.config.n_vq), dtype=np.int32)
        values = np.full(len(going), self.decision_ids[0], dtype=np.int32)
        for c in range(self.config.n_vq if going else 0):
            # head c reads local position c+1, whose input is the previous channel's code
            # (the decision token for c = 0): the off-by-one of docs/upstream-notes.md §nano-3
            values = np.asarray(choose_codes(c, going, depth_run(c + 1, values, going)),
                                dtype=np.int32)
            codes[going, c] = values
        kept = set(going)
        return [codes[i] if i in kept else None for i in range(n)]

    def batch_frames(self, state: GenerationState, h: np.ndarray, choose_codes,
                     decide) -> list[np.ndarray | None]:
        """`frames` for the streams of a shared state, every local position one graph over
        their rows (the depth sequences start afresh each frame)."""
        run = state.depth.per_frame(len(h), self.config.n_vq + 1)
        return self.frames(lambda p, values, streams: run(
            self.depth_feed(p, values), streams, p)["depth.logits"], h, choose_codes, decide)

    def prefill_stream(self, state: GenerationState, seq: int, rows: np.ndarray) -> np.ndarray:
        """`prefill` for stream `seq` of a shared state (one graph over its rows, as alone)."""
        feed = masked_row_feed(rows, self.config)
        return state.global_.append(seq, feed, len(rows))["global.hidden"]

    def step_hidden(self, state: GenerationState, seqs, rows: np.ndarray) -> np.ndarray:
        """One row per stream of a shared state (rows (n, n_vq + 1), row i of seqs[i]) → each
        row's hidden (n, D), one graph over all of them."""
        return state.global_.step(seqs, masked_row_feed(rows, self.config),
                                  variant="step")["global.hidden"]

    def frame_row(self, codes: np.ndarray) -> np.ndarray:
        """A generated frame as the next global row: the assistant slot token and its codes."""
        return np.concatenate([[self.config.audio_assistant_slot_token_id], codes]).astype(np.int32)[None]

    def close(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None
