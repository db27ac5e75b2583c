"""MossTTSDelay (MOSS-TTS 8B, v1.0 and v1.5): a Qwen3 backbone over rows of 1 text + n_vq
audio channels, a text head and n_vq audio heads in parallel, the delay staircase
(upstream `moss_tts_delay/modeling_moss_tts.py`; docs/upstream-notes.md §family-2).

A row [text, code_0 … code_{N−1}] embeds as token_embd[text] + Σ_k emb_ext.k[code_k]; the
pad code's row is a learned vector and is added like any other (P1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..ggml import F16, I32, GGMLType, Graph, TensorStore, Weights, ops
from ..ggml.graph import Tensor
from ..ggml.repack import types as repack_types
from ..nn import CacheView, last_row
from ..nn.session import DecodeSession, SharedDecodeSession, concat_rows
from ..sampling import DelaySamplingOptions, choose_rows, seen_per_head, seen_pooled
from . import qwen3, spec
from .delay_state import (DelayIds, DelayState, advance, audio_channels, forced_text,
                          text_allowed)
from .rows import check_ids, check_rows, row_feed

KIND = "delay"
FORMAT_VERSION = 1
PREFIX = "moss.delay"
TOKENIZER_KEY = "moss.tokenizer.json"
TEXT_HEAD = "output.weight"            # lm_heads.0 under its llama.cpp name
AUDIO_HEADS = "audio_heads.weight"     # lm_heads.1..N stacked: one matmul per step
# Generation budget in rows (frames + n_vq + 1 staircase rows + text, P25): the default of
# upstream's llama.cpp pipeline
MAX_NEW_ROWS = 2000
# In audio only GEN and DELAY may follow (P3) and a flush row samples no text at all, so such a
# step computes this many rows of the text head, not the vocabulary (~0.7 GB of a q4_K step)
FEW_TEXT_IDS = 2


@dataclass(frozen=True)
class DelayConfig:
    """Field names and defaults of upstream `MossTTSDelayConfig`."""

    language_config: qwen3.Qwen3Config
    vocab_size: int
    n_vq: int = 32
    audio_vocab_size: int = 1024
    pad_token_id: int = qwen3.PAD_ID
    im_start_token_id: int = qwen3.IM_START_ID
    im_end_token_id: int = qwen3.IM_END_ID
    audio_user_slot_token_id: int = qwen3.AUDIO_USER_SLOT_ID
    audio_assistant_gen_slot_token_id: int = qwen3.AUDIO_ASSISTANT_SLOT_ID
    audio_assistant_delay_slot_token_id: int = qwen3.AUDIO_DELAY_SLOT_ID
    audio_start_token_id: int = qwen3.AUDIO_START_ID
    audio_end_token_id: int = qwen3.AUDIO_END_ID
    audio_pad_code: int = 1024
    sampling_rate: int = 24000

    def __post_init__(self):
        check_ids(self, "Delay")

    @property
    def audio_rows(self) -> int:
        """Rows of each audio table and head: the codebook plus the pad code."""
        return self.audio_vocab_size + 1

    @property
    def ids(self) -> DelayIds:
        return DelayIds(self.n_vq, self.pad_token_id, self.im_end_token_id,
                        self.audio_start_token_id, self.audio_end_token_id,
                        self.audio_assistant_gen_slot_token_id,
                        self.audio_assistant_delay_slot_token_id, self.audio_pad_code)

    @classmethod
    def from_gguf(cls, meta) -> "DelayConfig":
        return spec.config_from_gguf(cls, meta, PREFIX,
                                     language_config=qwen3.Qwen3Config.from_gguf(meta))

    def to_metadata(self) -> dict:
        return spec.config_to_metadata(self, PREFIX) | self.language_config.to_metadata()

    def backbone_shapes(self) -> dict[str, tuple]:
        """The tensors of a llama.cpp Qwen3 GGUF: text embedding, blocks, norm, text head."""
        d = self.language_config.hidden_size
        return {"token_embd.weight": (self.vocab_size, d), TEXT_HEAD: (self.vocab_size, d)} \
            | self.language_config.tensor_shapes()

    def audio_shapes(self) -> dict[str, tuple]:
        """The audio tables and the stacked audio heads."""
        d = self.language_config.hidden_size
        return {f"emb_ext.{k}.weight": (self.audio_rows, d) for k in range(self.n_vq)} \
            | {AUDIO_HEADS: (self.n_vq * self.audio_rows, d)}

    def tensor_shapes(self) -> dict[str, tuple]:
        return self.backbone_shapes() | self.audio_shapes()


@dataclass(frozen=True)
class DelayWeights:
    token_embd: Tensor
    emb_ext: list[Tensor]
    layers: list[qwen3.Qwen3Layer]
    output_norm: Tensor
    text_head: Tensor
    audio_heads: Tensor                # [D, n_vq · audio_rows]

    @classmethod
    def from_tensors(cls, t: dict, cfg: DelayConfig) -> "DelayWeights":
        return cls(t["token_embd.weight"], [t[f"emb_ext.{k}.weight"] for k in range(cfg.n_vq)],
                   qwen3.layers_from_tensors(t, cfg.language_config), t["output_norm.weight"],
                   t[TEXT_HEAD], t[AUDIO_HEADS])


def matmul_only(repack: bool | None):
    """The Weights.load predicate of the tensors only mul_mat reads (the blocks' matrices and
    the audio heads; the token table and the text head are also gathered by get_rows) in the
    types repacked by default, or None when repacking is off (`repack`, else
    MOSS_TTS_REPACK; ggml/repack.py)."""
    types = repack_types(repack)
    if types is None:
        return None
    block = qwen3.LAYER_PREFIX.split("{")[0]        # "blk."
    return lambda name, t: (name.startswith(block) or name == AUDIO_HEADS) and t in types


# -- graph builders ---------------------------------------------------------------------------
def embed_rows(g: Graph, w: DelayWeights, cfg: DelayConfig, n_rows: int) -> Tensor:
    """[D, n_rows]: token_embd[text] + Σ_k emb_ext.k[code_k], pad rows included (P1)."""
    x = ops.get_rows(w.token_embd, g.input("rows.text", (n_rows,), I32))
    for k in range(cfg.n_vq):
        x = x + ops.get_rows(w.emb_ext[k], g.input(f"rows.code.{k}", (n_rows,), I32))
    return x


def build_rows(g: Graph, w: DelayWeights, cfg: DelayConfig, n_rows: int, kv: CacheView,
               last_only: bool, *, few_text_ids: bool = False) -> None:
    """Rows → "hidden" [D, R], "text_logits" [V, R], "audio_logits" [audio_rows, n_vq, R] for
    R = 1 (the last row: what generation samples from) or every row. With `few_text_ids`, the
    text logits are those of the I32 input "text_ids" [FEW_TEXT_IDS] only, [FEW_TEXT_IDS, R]."""
    h = qwen3.forward(embed_rows(g, w, cfg, n_rows), w.layers, w.output_norm, cfg.language_config,
                      kv=kv)
    if last_only:
        h = last_row(h)
    r = h.ne[1]
    g.output(h, "hidden", ndim=2)
    head = w.text_head
    if few_text_ids:   # [D, FEW_TEXT_IDS]: the rows of the ids the next row may take
        head = ops.get_rows(head, g.input("text_ids", (FEW_TEXT_IDS,), I32))
    g.output(ops.mul_mat(head, h), "text_logits", ndim=2)
    audio = ops.reshape(ops.mul_mat(w.audio_heads, h), cfg.audio_rows, cfg.n_vq, r)
    g.output(audio, "audio_logits", ndim=3)


# -- one row of generation --------------------------------------------------------------------
def audio_seen(history: np.ndarray, cfg: DelayConfig) -> np.ndarray:
    """bool [2, audio_rows]: codebook 0's own history, and the union over codebooks 1..N−1
    (HF samples those as one batch, so their repetition history is pooled, P5)."""
    return np.vstack([seen_per_head(history[:, :1], cfg.audio_rows),
                      seen_pooled(history[:, 1:], cfg.audio_rows)])


def few_text_ids(state: DelayState, cfg: DelayConfig) -> np.ndarray | None:
    """The text ids whose logits the row after `state` can use, padded to FEW_TEXT_IDS, when
    that few (in audio, or a forced flush row: none); None when it needs the vocabulary."""
    if forced_text(state, cfg.ids) is not None:
        allowed = np.zeros(0, dtype=np.int64)
    elif state.is_audio:
        allowed = np.flatnonzero(text_allowed(state, cfg.ids, cfg.vocab_size))
    else:
        return None
    if len(allowed) > FEW_TEXT_IDS:
        return None
    ids = np.full(FEW_TEXT_IDS, cfg.audio_assistant_gen_slot_token_id, dtype=np.int32)
    ids[:len(allowed)] = allowed
    return ids


def row_logits(out: dict, i: int, ids: np.ndarray | None,
               cfg: DelayConfig) -> tuple[np.ndarray, np.ndarray]:
    """Row i of a graph's outputs → (text logits [V], audio logits [n_vq, audio_rows]); with
    the few `ids` fed to the text head, the text logits are −inf outside them."""
    text = out["text_logits"][i]
    if ids is not None:
        text = np.full(cfg.vocab_size, -np.inf, dtype=np.float32)
        text[ids] = out["text_logits"][i]
    return text, out["audio_logits"][i]


def step_run(session: DecodeSession, rows: np.ndarray, state: DelayState,
             cfg: DelayConfig) -> tuple[np.ndarray, np.ndarray]:
    """Feed rows; → (text logits [V], audio logits [n_vq, audio_rows]) of the last row, the
    text logits −inf outside the ids the row after `state` may take when those are few."""
    ids = few_text_ids(state, cfg)
    if ids is None:
        out = session.prefill(row_feed(rows), len(rows), variant=True)[-1]
    else:
        out = session.prefill(row_feed(rows), len(rows), variant="few",
                              extra={"text_ids": ids})[-1]
    return row_logits(out, 0, ids, cfg)


def next_row(state: DelayState, text_logits: np.ndarray, audio_logits: np.ndarray,
             seen: np.ndarray, cfg: DelayConfig, opts: DelaySamplingOptions, rng):
    """The next row [1 + n_vq] and the state after it (§family-2.6): the text token forced or
    sampled under the masks, then the codebooks this row samples (pad elsewhere)."""
    ids = cfg.ids
    token = forced_text(state, ids)
    if token is None:
        scores = np.where(text_allowed(state, ids, len(text_logits)), text_logits, -np.inf)
        token = int(choose_rows(scores[None], rng, opts.text_channel)[0])
    row = np.full(1 + cfg.n_vq, cfg.audio_pad_code, dtype=np.int64)
    row[0] = token
    on = audio_channels(state, ids)
    if on.any():
        scores = audio_logits[on].astype(np.float64)
        scores[:, cfg.audio_pad_code] = -np.inf              # heads never emit the pad
        channel_seen = seen[np.minimum(np.flatnonzero(on), 1)]
        row[1:][on] = choose_rows(scores, rng, opts.audio_channel, channel_seen)
    return row, advance(state, token, ids)


class RowSampler:
    """One stream's choices (§family-2.6): its state machine, the repetition history of its
    codes (the prompt's included, P5), its own generator (seeded per stream), and its end:
    `<|im_end|>` or its budget of rows. Shared by `DelayModel.iter_rows` and the batched
    decode (models/delay_decode.py), so a stream makes the same rows alone or among others."""

    def __init__(self, rows: np.ndarray, cfg: DelayConfig, options: DelaySamplingOptions,
                 seed: int | None, max_new_rows: int):
        if max_new_rows < 1:
            raise InputError(f"max_new_rows must be at least 1, got {max_new_rows}")
        self.cfg, self.options, self.max_new_rows = cfg, options, max_new_rows
        self.rng = np.random.default_rng(seed)
        self.state = DelayState.from_prompt(rows[:, 0], cfg.ids)
        self.seen = audio_seen(rows[:, 1:], cfg)
        self.n_rows = 0

    def text_ids(self) -> np.ndarray | None:
        """The few text ids the next row may take (`few_text_ids`), or None: the vocabulary."""
        return few_text_ids(self.state, self.cfg)

    def take(self, text_logits: np.ndarray, audio_logits: np.ndarray) -> tuple[np.ndarray, bool]:
        """The logits of the last row fed → (the next row [1 + n_vq], whether the stream goes
        on after it)."""
        row, self.state = next_row(self.state, text_logits, audio_logits, self.seen, self.cfg,
                                   self.options, self.rng)
        self.seen |= audio_seen(row[None, 1:], self.cfg)
        self.n_rows += 1
        return row, not self.state.stopping and self.n_rows < self.max_new_rows


# -- the runtime ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PublishedParts:
    """What a llama.cpp Qwen3 GGUF lacks, read from beside it (models/delay_published.py)."""

    config: DelayConfig
    audio: TensorStore               # emb_ext.* and the stacked audio heads
    tokenizer_json: str


class DelayModel:
    """MossTTSDelay on a backend; stateless after load (style C16). `weights` is a moss-tts
    Delay GGUF, or with `published` the backbone GGUF of upstream's llama.cpp layout.
    `kv_type` F16 (upstream llama.cpp's default) halves the KV cache: 144 MB per 1024 rows
    on the 8B shape; F32 keeps the attention exact to f32 rounding."""

    def __init__(self, weights: Weights, *, published: PublishedParts | None = None,
                 kv_type: GGMLType = F16):
        self.weights = weights
        self.backend = weights.backend
        self.kv_type = GGMLType(kv_type)
        self.audio = None
        if published is None:
            weights.file.check_kind(KIND, version=FORMAT_VERSION)
            self.config = DelayConfig.from_gguf(weights.file)
            tensors = weights.require(self.config.tensor_shapes())
            self.tokenizer_json = weights.file.get(TOKENIZER_KEY)
        else:
            self.config, self.audio = published.config, published.audio
            self.tokenizer_json = published.tokenizer_json
            tensors = weights.require(self.config.backbone_shapes()) | {
                n: self.audio[n] for n in self.config.audio_shapes()}
        self.w = DelayWeights.from_tensors(tensors, self.config)

    def make_session(self, capacity: int, *, shared: bool = False) -> DecodeSession:
        """A decode session for `capacity` rows (`shared`: a SharedDecodeSession, several
        streams in it, models/delay_decode.py). Variants: True = heads on the last row only,
        "few" = that with the text logits of the input "text_ids" only (`step_run`); False =
        heads on every row (`forward`; a batched step, one row per stream), "rows_few" = that
        with the few text ids."""
        lc = self.config.language_config
        return (SharedDecodeSession if shared else DecodeSession)(
            lambda g, n, kv, variant: build_rows(g, self.w, self.config, n, kv,
                                                 variant in (True, "few"),
                                                 few_text_ids=variant in ("few", "rows_few")),
            backend=self.backend, n_layer=lc.num_hidden_layers,
            n_kv_head=lc.num_key_value_heads, head_dim=lc.head_dim, capacity=capacity,
            prefix="backbone", name="delay", dtype=self.kv_type)

    def forward(self, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """rows [S, 1 + n_vq] → (hidden [S, H], text_logits [S, V], audio_logits
        [n_vq, S, audio_rows]) with the audio pad column at −inf, as upstream's forward."""
        rows = check_rows(rows, self.config)
        with self.make_session(len(rows)) as session:
            out = concat_rows(session.prefill(row_feed(rows), len(rows), variant=False))
        audio = np.ascontiguousarray(out["audio_logits"].transpose(1, 0, 2))
        audio[:, :, self.config.audio_pad_code] = -np.inf
        return out["hidden"], out["text_logits"], audio

    def generate(self, rows, *, options: DelaySamplingOptions = DelaySamplingOptions(),
                 seed: int | None = None, max_new_rows: int = MAX_NEW_ROWS) -> np.ndarray:
        """Prompt rows → the new rows [N, 1 + n_vq], up to and including `<|im_end|>`."""
        return np.array(list(self.iter_rows(rows, options=options, seed=seed,
                                            max_new_rows=max_new_rows)),
                        dtype=np.int64).reshape(-1, self.config.n_vq + 1)

    def iter_rows(self, rows, *, options: DelaySamplingOptions = DelaySamplingOptions(),
                  seed: int | None = None, max_new_rows: int = MAX_NEW_ROWS):
        """Rows as they are generated (the generator of `generate`)."""
        rows = check_rows(rows, self.config)
        sampler = RowSampler(rows, self.config, options, seed, max_new_rows)
        with self.make_session(len(rows) + max_new_rows) as session:
            feed, going = rows, True
            while going:
                row, going = sampler.take(*step_run(session, feed, sampler.state, self.config))
                yield row
                feed = row[None]

    def close(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None
        if self.audio is not None:
            self.audio.close()
            self.audio = None
