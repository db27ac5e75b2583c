"""MOSS-TTS-Local-Transformer-v1.5 (4B): a Qwen3 backbone over rows of 1 text + n_vq audio
channels and a 1-layer GPT-2-style local block that emits one frame's codes (upstream
`moss_tts_local_v1.5/modeling_moss_tts.py`, `gpt2_decoder.py`; docs/upstream-notes.md §family-4,
§family-6).

A row [text, code_0 … code_{N−1}] embeds as token_embd[text] + Σ_k audio_embeddings[k][code_k]
with pad codes contributing zero (the tables have no pad row, P12). Heads are tied: audio head k
is audio_embeddings[k]; the text head is replaced by a 2-way continue/stop head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, InputError, whole_number
from ..ggml import F16, I32, GGMLType, Graph, Weights, ops
from ..ggml.backend import released_on_error
from ..ggml.graph import Tensor
from ..nn import CacheView, last_row, masked_embedding_sum
from ..nn.session import (DecodeSession, SessionsOwner, SharedDecodeSession, concat_rows,
                          frames_capacity)
from ..sampling import LocalV15SamplingOptions, check_finite, choose_rows, sample_audio_code
from . import gpt2, qwen3, spec
from .rows import masked_row_feed

KIND = "local-v15"
FORMAT_VERSION = 1
PREFIX = "moss.local_v15"
TOKENIZER_KEY = "moss.tokenizer.json"
LOCAL = "local_transformer"
DECISION_HEAD = "local_text_lm_head.weight"    # [2, D]: row 0 continue, row 1 stop (P13)
MAX_FRAMES = 4096                              # upstream generate's default frame budget
CONTINUE, STOP = 0, 1


@dataclass(frozen=True)
class LocalV15Config:
    """Field names and defaults of upstream `MossTTSLocalConfig` (§family-4.1)."""

    language_config: qwen3.Qwen3Config
    local: gpt2.GPT2Config
    vocab_size: int
    n_vq: int = 12
    audio_vocab_size: int = 1024
    audio_pad_token_id: int = 1024
    pad_token_id: int = qwen3.PAD_ID
    im_start_token_id: int = qwen3.IM_START_ID
    im_end_token_id: int = qwen3.IM_END_ID
    audio_start_token_id: int = 151669        # this model's own pair, not Qwen's (P13)
    audio_end_token_id: int = 151670
    audio_user_slot_token_id: int = qwen3.AUDIO_USER_SLOT_ID
    audio_assistant_slot_token_id: int = qwen3.AUDIO_ASSISTANT_SLOT_ID
    sampling_rate: int = 48000

    def __post_init__(self):
        if not 1 <= self.n_vq <= 64 or not 1 <= self.audio_vocab_size <= 1 << 16:
            raise ConfigError(f"Local v1.5: n_vq {self.n_vq} or audio_vocab_size "
                              f"{self.audio_vocab_size} is out of range (a corrupt file?)")
        if self.local.n_embd != self.language_config.hidden_size:
            raise ConfigError(f"Local v1.5: the local block's width {self.local.n_embd} must "
                              f"equal the backbone's {self.language_config.hidden_size} (tied "
                              "audio tables feed both)")
        if self.audio_pad_token_id < self.audio_vocab_size:
            raise ConfigError(f"Local v1.5: audio pad id {self.audio_pad_token_id} lies inside "
                              f"the codebooks (size {self.audio_vocab_size})")
        top = max(self.pad_token_id, self.im_start_token_id, self.im_end_token_id,
                  self.audio_start_token_id, self.audio_end_token_id,
                  self.audio_user_slot_token_id, self.audio_assistant_slot_token_id)
        if top >= self.vocab_size:
            raise ConfigError(f"Local v1.5: special id {top} lies outside the text vocabulary "
                              f"of {self.vocab_size}")

    @classmethod
    def from_gguf(cls, meta) -> "LocalV15Config":
        return spec.config_from_gguf(cls, meta, PREFIX,
                                     language_config=qwen3.Qwen3Config.from_gguf(meta),
                                     local=gpt2.GPT2Config.from_gguf(meta, f"{PREFIX}.local"))

    def to_metadata(self) -> dict:
        return (spec.config_to_metadata(self, PREFIX) | self.language_config.to_metadata()
                | spec.config_to_metadata(self.local, f"{PREFIX}.local"))

    def tensor_shapes(self) -> dict[str, tuple]:
        d = self.language_config.hidden_size
        shapes = {"token_embd.weight": (self.vocab_size, d)} | self.language_config.tensor_shapes()
        for i in range(self.local.n_layer):
            shapes |= spec.shapes(self.local.layer_spec(), f"{LOCAL}.h.{i}.")
        shapes |= {f"{LOCAL}.ln_f.weight": (d,), f"{LOCAL}.ln_f.bias": (d,),
                   DECISION_HEAD: (2, d)}
        return shapes | {f"audio_embeddings.{k}.weight": (self.audio_vocab_size, d)
                         for k in range(self.n_vq)}


@dataclass(frozen=True)
class LocalV15Weights:
    token_embd: Tensor
    layers: list[qwen3.Qwen3Layer]
    output_norm: Tensor
    local_layers: list[gpt2.GPT2Layer]
    local_ln_f: tuple[Tensor, Tensor]
    decision_head: Tensor
    audio_embeddings: list[Tensor]     # input tables, and (tied) the audio heads

    @classmethod
    def from_tensors(cls, t: dict, cfg: LocalV15Config) -> "LocalV15Weights":
        return cls(t["token_embd.weight"], qwen3.layers_from_tensors(t, cfg.language_config),
                   t["output_norm.weight"],
                   [gpt2.GPT2Layer.from_tensors(t, f"{LOCAL}.h.{i}.", cfg.local)
                    for i in range(cfg.local.n_layer)],
                   (t[f"{LOCAL}.ln_f.weight"], t[f"{LOCAL}.ln_f.bias"]), t[DECISION_HEAD],
                   [t[f"audio_embeddings.{k}.weight"] for k in range(cfg.n_vq)])


# -- graph builders ---------------------------------------------------------------------------
def embed_rows(g: Graph, w: LocalV15Weights, cfg: LocalV15Config, n_rows: int) -> Tensor:
    """[D, n_rows]: token_embd[text] + Σ_k mask_k · audio_embeddings[k][code_k] (P12)."""
    text = g.input("rows.text", (n_rows,), I32)
    ids = [g.input(f"rows.code.{k}", (n_rows,), I32) for k in range(cfg.n_vq)]
    masks = [g.input(f"rows.mask.{k}", (n_rows, 1)) for k in range(cfg.n_vq)]
    return ops.add(ops.get_rows(w.token_embd, text),
                   masked_embedding_sum(w.audio_embeddings, ids, masks))


def build_rows(g: Graph, w: LocalV15Weights, cfg: LocalV15Config, n_rows: int, kv: CacheView,
               last_only: bool) -> None:
    """Rows → "hidden" [D, R], the post-norm backbone state of the last row (R = 1: what a
    frame starts from) or of every row."""
    h = qwen3.forward(embed_rows(g, w, cfg, n_rows), w.layers, w.output_norm,
                      cfg.language_config, kv=kv)
    g.output(last_row(h) if last_only else h, "hidden", ndim=2)


def build_depth_step(g: Graph, w: LocalV15Weights, cfg: LocalV15Config, kv: CacheView,
                     p: int, n_rows: int = 1) -> None:
    """Local position p of a frame (§family-4.4) for n_rows streams (one row each): input the
    backbone hidden (p = 0) or audio_embeddings[p−1][code] (p ≥ 1); output audio head p's
    logits "depth.logits" (n_rows, V) and, at p = 0, the continue/stop logits
    "depth.decision" (n_rows, 2) (position 0 feeds both, P13)."""
    if p == 0:
        x = g.input("depth.h", (n_rows, cfg.local.n_embd))
    else:
        x = ops.get_rows(w.audio_embeddings[p - 1], g.input("depth.code", (n_rows,), I32))
    # the local block rotates interleaved pairs over head_dim 80 (GPT-J), not NEOX halves (P10)
    h = gpt2.forward(x, w.local_layers, w.local_ln_f, cfg.local, kv=kv, stage="depth")
    if p == 0:
        g.output(ops.mul_mat(w.decision_head, h), "depth.decision", ndim=2)
    g.output(ops.mul_mat(w.audio_embeddings[p], h), "depth.logits", ndim=2)


def depth_outputs(out: dict) -> dict[str, np.ndarray]:
    """A local position graph's outputs by their names here: "logits" (rows, V) and, at
    position 0, "decision" (rows, 2)."""
    return {"logits": out["depth.logits"]} | (
        {"decision": out["depth.decision"]} if "depth.decision" in out else {})


# -- sampling ---------------------------------------------------------------------------------
def decide(logits: np.ndarray, rng, opts: LocalV15SamplingOptions) -> int:
    """CONTINUE or STOP from the 2-way head (argmax continues on a tie, as upstream)."""
    check_finite(logits, "continue/stop")
    return int(choose_rows(logits[None], rng, opts.text_channel)[0])


class FrameChooser:
    """One utterance's choices (§family-4.6): its generator (seeded per utterance), each
    channel's history of generated codes (the repetition penalty), and its frame budget.
    Shared by `LocalV15Model.iter_frames` and the batched decode (models/local_v15_decode.py),
    so a stream makes the same draws alone or among others."""

    def __init__(self, cfg: LocalV15Config, options: LocalV15SamplingOptions, seed: int | None,
                 max_frames: int):
        self.options, self.max_frames = options, max_frames
        self.rng = np.random.default_rng(seed)
        self.seen = np.zeros((cfg.n_vq, cfg.audio_vocab_size), dtype=bool)
        self.n_frames = 0

    def goes_on(self, decision: np.ndarray) -> bool:
        """The frame's continue/stop choice from the 2-way head's logits [2]."""
        return decide(decision, self.rng, self.options) == CONTINUE

    def choose_code(self, c: int, logits: np.ndarray) -> int:
        return sample_audio_code(logits, self.seen[c], self.rng, self.options)

    def accept(self, codes: np.ndarray) -> bool:
        """Record a generated frame; False when the budget ends with it."""
        self.seen[np.arange(len(codes)), codes] = True
        self.n_frames += 1
        return self.n_frames < self.max_frames


# -- the runtime ------------------------------------------------------------------------------
class GenerationState(SessionsOwner):
    """Per-utterance state owned by the caller (style C16): the backbone's decode session for
    the prompt plus the frame budget, and the per-frame local session (one replayed step graph
    per local position, reset every frame: upstream's static 13-slot cache). With `streams`,
    both sessions are shared by up to that many streams (`SharedDecodeSession`), a step
    carrying one row per stream."""

    SESSIONS = ("backbone", "depth")

    def __init__(self, model: "LocalV15Model", capacity: int, *, streams: int | None = None):
        cfg, w, lc, loc = model.config, model.w, model.config.language_config, model.config.local
        self.capacity = capacity
        session = DecodeSession if streams is None else SharedDecodeSession
        self.backbone = session(
            lambda g, n, kv, last: build_rows(g, w, cfg, n, kv, last), backend=model.backend,
            n_layer=lc.num_hidden_layers, n_kv_head=lc.num_key_value_heads,
            head_dim=lc.head_dim, capacity=capacity, prefix="backbone", name="local_v15",
            dtype=model.kv_type)
        with released_on_error(self.backbone):
            self.depth = session(
                lambda g, n, kv, p: build_depth_step(g, w, cfg, kv, p, n), backend=model.backend,
                n_layer=loc.n_layer, n_kv_head=loc.n_head, head_dim=loc.head_dim,
                capacity=frames_capacity(cfg.n_vq, streams), prefix="depth", name="local_v15.depth")


class LocalV15Model:
    """MOSS-TTS-Local-Transformer-v1.5 on a backend; stateless after load (style C16).
    `kv_type` F16 halves the backbone's KV cache (144 KB per row on the 4B shape); F32 keeps
    attention exact to f32 rounding."""

    def __init__(self, weights: Weights, *, kv_type: GGMLType = F16):
        self.weights = weights
        self.backend = weights.backend
        self.kv_type = GGMLType(kv_type)
        with released_on_error(weights):
            weights.file.check_kind(KIND, version=FORMAT_VERSION)
            self.config = LocalV15Config.from_gguf(weights.file)
            self.w = LocalV15Weights.from_tensors(
                weights.require(self.config.tensor_shapes(), floats=True), self.config)
            self.tokenizer_json = weights.file.get(TOKENIZER_KEY)

    def make_state(self, capacity: int, *, streams: int | None = None) -> GenerationState:
        """With `streams`, both sessions are shared by up to that many streams (models/
        local_v15_decode.py): `capacity` backbone rows in all."""
        return GenerationState(self, capacity, streams=streams)

    def check_rows(self, rows) -> dict[str, np.ndarray]:
        """rows int [S, 1 + n_vq] → the backbone's row inputs (InputError when malformed)."""
        return masked_row_feed(rows, self.config)

    # -- the steps ------------------------------------------------------------------------------
    def prefill(self, state: GenerationState, rows) -> np.ndarray:
        """Rows appended after what the state holds → the hidden state of the last row [D]."""
        feed = self.check_rows(rows)
        return state.backbone.prefill(feed, len(rows), variant=True)[-1]["hidden"][0]

    def depth_feed(self, p: int, values) -> dict[str, np.ndarray]:
        """Host inputs of local position p for one row per stream: values are the backbone
        hiddens (n, D) at p = 0, the previous channel's codes after."""
        if p == 0:
            return {"depth.h": np.asarray(values, np.float32).reshape(-1, self.config.local.n_embd)}
        return {"depth.code": np.asarray(values, np.int32).reshape(-1)}

    def depth_rows(self, state: GenerationState, p: int, values) -> dict[str, np.ndarray]:
        """Local position p of the current frame for the one stream of `state` (p = 0 starts
        a fresh local sequence) → `depth_outputs` with one row."""
        if p == 0:
            state.depth.reset()
        return depth_outputs(state.depth.run(self.depth_feed(p, values), 1, variant=p))

    def depth_position(self, state: GenerationState, p: int, value) -> dict[str, np.ndarray]:
        """Local position p of the current frame: value is the backbone hidden (p = 0, which
        starts a fresh local sequence) or code p−1. → {"logits": audio head p [V]} and, at
        p = 0, "decision" [2]."""
        return {name: rows[0] for name, rows in self.depth_rows(state, p, value).items()}

    def frame(self, state: GenerationState, h: np.ndarray,
              chooser: FrameChooser) -> np.ndarray | None:
        """One frame's codes [n_vq] from the backbone hidden h, or None when the 2-way head
        stops (that frame has no codes: no trailing junk frame); the choices are `chooser`'s."""
        return self.frames(lambda p, values, _: self.depth_rows(state, p, values),
                           np.asarray(h)[None], lambda _, decision: chooser.goes_on(decision),
                           lambda _, c, logits: chooser.choose_code(c, logits))[0]

    def frames(self, depth_run, h: np.ndarray, goes_on, choose_code) -> list[np.ndarray | None]:
        """One frame for each of k streams from their backbone hiddens h (k, D): position 0
        gives each stream's continue/stop choice (`goes_on(i, decision logits)`) and channel
        0's logits; the streams that go on then fill channels 1.. position by position, each
        code chosen by `choose_code(i, channel, logits)`; None for a stream that stops.
        `depth_run(p, values, streams)` runs local position p for the listed streams (one row
        each) → their `depth_outputs`, in that order."""
        k = len(h)
        out = depth_run(0, h, list(range(k)))
        going = [i for i in range(k) if goes_on(i, out["decision"][i])]
        codes = np.zeros((k, self.config.n_vq), dtype=np.int64)
        logits = out["logits"][going]
        for c in range(self.config.n_vq if going else 0):
            if c:   # position c reads code c−1 through audio_embeddings[c−1]
                logits = depth_run(c, codes[going, c - 1], going)["logits"]
            for j, i in enumerate(going):
                codes[i, c] = choose_code(i, c, logits[j])
        kept = set(going)
        return [codes[i] if i in kept else None for i in range(k)]

    def batch_frames(self, state: GenerationState, h: np.ndarray, goes_on,
                     choose_code) -> list[np.ndarray | None]:
        """`frames` for the streams of a shared state, every local position one graph over
        their rows (the local sequences start afresh each frame)."""
        run = state.depth.per_frame(len(h), self.config.n_vq)
        return self.frames(lambda p, values, streams: depth_outputs(run(
            self.depth_feed(p, values), streams, p)), h, goes_on, choose_code)

    def frame_row(self, codes: np.ndarray) -> np.ndarray:
        """A generated frame as the next backbone row: the assistant slot and its codes."""
        return np.concatenate([[self.config.audio_assistant_slot_token_id], codes])[None]

    # -- research API ---------------------------------------------------------------------------
    def forward(self, rows) -> np.ndarray:
        """rows [S, 1 + n_vq] → the post-norm backbone hidden state of every row [S, D]."""
        feed = self.check_rows(rows)
        with self.make_state(len(rows)) as state:
            outs = state.backbone.prefill(feed, len(rows), variant=False)
        return concat_rows(outs)["hidden"]

    def depth_logits(self, hidden_row, codes=()) -> tuple[np.ndarray, np.ndarray]:
        """Teacher-forced local block: hidden_row [D] and a frame's codes [k ≤ n_vq] →
        (continue/stop logits [2], audio logits [min(k + 1, n_vq), V]: channel c given
        codes[:c])."""
        cfg = self.config
        h = np.asarray(hidden_row, dtype=np.float32)
        codes = np.asarray(codes)
        if h.shape != (cfg.language_config.hidden_size,):
            raise InputError(f"hidden_row must have shape [{cfg.language_config.hidden_size}], "
                             f"got {list(h.shape)}")
        if codes.ndim != 1 or len(codes) > cfg.n_vq or (len(codes) and (
                codes.dtype.kind not in "iu" or codes.min() < 0
                or codes.max() >= cfg.audio_vocab_size)):
            raise InputError(f"codes must be at most {cfg.n_vq} integers in "
                             f"[0, {cfg.audio_vocab_size}), got {codes.dtype} {list(codes.shape)}")
        with self.make_state(1) as state:
            out = self.depth_position(state, 0, h)
            decision, logits = out["decision"], [out["logits"]]
            for c in range(1, min(len(codes) + 1, cfg.n_vq)):
                logits.append(self.depth_position(state, c, int(codes[c - 1]))["logits"])
        return decision, np.stack(logits)

    def iter_frames(self, rows, *, options: LocalV15SamplingOptions = LocalV15SamplingOptions(),
                    seed: int | None = None, max_frames: int = MAX_FRAMES):
        """Frames [n_vq] generated after prompt rows until the 2-way head stops or the budget
        ends (§family-4.6). The repetition history is the generated frames only, per channel."""
        if not isinstance(options, LocalV15SamplingOptions):
            raise InputError(f"options must be a LocalV15SamplingOptions, got "
                             f"{type(options).__name__}")
        max_frames = whole_number(max_frames, "max_frames", 1)
        seed = None if seed is None else whole_number(seed, "seed", 0)
        self.check_rows(rows)
        return self._frames(np.asarray(rows), options, seed, max_frames)

    def _frames(self, rows, options, seed, max_frames):
        chooser = FrameChooser(self.config, options, seed, max_frames)
        with self.make_state(len(rows) + max_frames) as state:
            h = self.prefill(state, rows)
            while True:
                codes = self.frame(state, h, chooser)
                if codes is None:
                    return
                going = chooser.accept(codes)
                yield codes
                if not going:   # the last frame's row: nothing would read its hidden
                    return
                h = self.prefill(state, self.frame_row(codes))

    def generate(self, rows, **kwargs) -> np.ndarray:
        """Prompt rows → the new rows [N, 1 + n_vq] (assistant slot + codes; the stop is not a
        row). Keywords as `iter_frames`."""
        frames = list(self.iter_frames(rows, **kwargs))
        out = np.full((len(frames), 1 + self.config.n_vq),
                      self.config.audio_assistant_slot_token_id, dtype=np.int64)
        if frames:
            out[:, 1:] = frames
        return out

    def close(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None
