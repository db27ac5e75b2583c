"""Encoder and decoder towers: patch stages (pure reshapes) and causal sliding-window
transformer stages (docs/upstream-notes.md §codecs-1.2-1.5), run chunk by chunk with per-stage KV
caches.

Every stage is causal and patching is frame-local, so a tower fed a few code frames at a time
with each stage's keys kept for its window computes exactly what it computes on the whole
sequence: offline encode/decode and streaming decode are the same code, and memory stays
bounded however long the audio is.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..ggml import F16, I32, ops
from ..ggml.graph import Graph, Tensor
from ..nn import KVCache, cached_self_attention, layer_norm, layer_scale, linear, mlp
from ..nn.patch import patchify, unpatchify
from .config import PATCH, TRANSFORMER, CodecConfig, StageConfig

# Slot counts are multiples of 32: an f16 mask row is then a multiple of 64 bytes, and the f32
# activations placed after it stay 64-byte aligned (ggml's CPU buffers only align to 32); a
# misaligned f32 matmul was 30-50 % slower in bench/codec.py. Extra slots are always masked.
SLOT_ALIGN = 32
PREFIX_STEPS = ("chunk", "doubling", "full")  # how the attended prefix grows (TowerState)

LAYER_TENSORS = ("norm1.weight", "norm1.bias", "self_attn.in_proj.weight",
                 "self_attn.out_proj.weight", "layer_scale_1.scale", "norm2.weight", "norm2.bias",
                 "ffn.0.weight", "ffn.2.weight", "layer_scale_2.scale")


@dataclass(frozen=True)
class CodecLayer:
    """One layer's weights; attribute = tensor name below `<tower>.<i>.transformer.layers.<l>.`."""

    norm1_weight: Tensor
    norm1_bias: Tensor
    self_attn_in_proj_weight: Tensor
    self_attn_out_proj_weight: Tensor
    layer_scale_1_scale: Tensor
    norm2_weight: Tensor
    norm2_bias: Tensor
    ffn_0_weight: Tensor
    ffn_2_weight: Tensor
    layer_scale_2_scale: Tensor


@dataclass(frozen=True)
class TransformerStage:
    config: StageConfig
    input_proj: Tensor | None      # None: identity (v1 stores no square projection)
    output_proj: Tensor | None
    layers: tuple[CodecLayer, ...]


def load_tower(weights, cfg: CodecConfig, tower: str) -> list[TransformerStage | StageConfig]:
    """Stage list of a tower: TransformerStage records, and the StageConfig of patch stages."""
    stages = []
    for i, s in enumerate(getattr(cfg, tower)):
        if s.kind == PATCH:
            stages.append(s)
            continue
        p = f"{tower}.{i}."
        layers = tuple(CodecLayer(**{n.replace(".", "_"): weights[f"{p}transformer.layers.{il}.{n}"]
                                     for n in LAYER_TENSORS}) for il in range(s.n_layers))
        stages.append(TransformerStage(
            s, weights[p + "input_proj.weight"] if s.has_input_proj else None,
            weights[p + "output_proj.weight"] if s.has_output_proj else None, layers))
    return stages


def stage_attention(qkv: Tensor, s: StageConfig, cfg: CodecConfig, *, il: int,
                    caches: KVCache | Sequence[KVCache], inputs: dict | Sequence[dict]) -> Tensor:
    """Fused q|k|v rows [3d, T] → attention output [d, T] over a stage's window cache. Several
    streams (a cache and its inputs each, their rows one stream after another): each stream's
    rows attend over its own cache, as that stream alone does."""
    if isinstance(caches, KVCache):
        caches, inputs = (caches,), (inputs,)
    parts, row = [], 0
    for cache, own in zip(caches, inputs):
        t = own["positions"].ne[0]
        rows = qkv if t == qkv.ne[1] else \
            ops.view(qkv, (qkv.ne[0], t), (qkv.nb[1],), row * qkv.nb[1])       # [3d, t]
        # RoPE on interleaved pairs (ggml "normal"), positions within this stage's own sequence
        parts.append(cached_self_attention(rows, cache, il, n_heads=s.n_heads, rope_mode="normal",
                                           rope_base=cfg.rope_base, **own))
        row += t
    return functools.reduce(lambda a, b: ops.concat(a, b, 1), parts)


def codec_layer(x: Tensor, w: CodecLayer, s: StageConfig, cfg: CodecConfig, *, il: int,
                cache: KVCache | Sequence[KVCache], inputs: dict | Sequence[dict],
                name: str) -> Tensor:
    """x + LS1·attn(LN1 x), then x + LS2·ffn(LN2 x); x [d, T] (docs/upstream-notes.md
    §codecs-1.4). Several streams' rows: every row-wise op runs once over all of them, the
    attention per stream (`stage_attention`)."""
    h = layer_norm(x, w.norm1_weight, w.norm1_bias, eps=cfg.norm_eps)
    qkv = linear(h, w.self_attn_in_proj_weight)                              # [3d, T], no bias
    o = stage_attention(qkv, s, cfg, il=il, caches=cache, inputs=inputs)    # [d, T]
    x = x + layer_scale(linear(o, w.self_attn_out_proj_weight), w.layer_scale_1_scale)
    h = layer_norm(x, w.norm2_weight, w.norm2_bias, eps=cfg.norm_eps)
    # exact erf GELU (nn.GELU() / F.gelu default), not the tanh approximation
    x = x + layer_scale(mlp(h, w.ffn_0_weight, w.ffn_2_weight, activation="gelu_erf"),
                        w.layer_scale_2_scale)
    return ops.name(x, f"{name}.{il}.out")


def transformer_stage(x: Tensor, stage: TransformerStage, cfg: CodecConfig, *,
                      caches: KVCache | Sequence[KVCache], inputs: dict | Sequence[dict],
                      name: str) -> Tensor:
    """[in_dim, T] → input_proj → layers → output_proj → [out_dim, T] (several streams: a
    cache and inputs each, as in `codec_layer`)."""
    if stage.input_proj is not None:
        x = linear(x, stage.input_proj)
    for il, layer in enumerate(stage.layers):
        x = codec_layer(x, layer, stage.config, cfg, il=il, cache=caches, inputs=inputs, name=name)
    if stage.output_proj is not None:
        x = linear(x, stage.output_proj)
    return x


class TowerState:
    """The running state of one tower: per transformer stage a ring KV cache of
    `context + chunk − 1` slots (exact for any chunk up to `chunk` positions) and its position.

    `prefix` sets how many slots a chunk attends over while the rings fill (see slot_counts):
    "chunk" steps whole chunks (offline runs: a few big chunks), "doubling" steps powers of two
    of frames (streaming: a handful of graphs, each built once, for many small pushes), "full"
    always attends over every slot (one graph per push size). `name` prefixes its graph inputs
    (default the tower's): streams decoded in one graph each have their own.
    """

    def __init__(self, cfg: CodecConfig, tower: str, max_frames: int, backend, *,
                 prefix: str = "chunk", v_trans: bool = False, name: str | None = None):
        if prefix not in PREFIX_STEPS:
            raise ConfigError(f"TowerState: prefix must be one of {PREFIX_STEPS}, got {prefix!r}")
        self.cfg = cfg
        self.prefix = prefix
        self.tower = tower
        self.name = name or tower
        self.stages = getattr(cfg, tower)
        self.max_frames = max_frames
        self.per_frame = positions_per_frame(cfg, tower)
        self.caches: dict[int, KVCache] = {}
        for i, s in enumerate(self.stages):
            if s.kind == TRANSFORMER:
                capacity = _round_up(s.context + max_frames * self.per_frame[i] - 1, SLOT_ALIGN)
                self.caches[i] = KVCache(s.n_layers, s.n_heads, s.head_dim, capacity,
                                         backend=backend, v_trans=v_trans)
        self.position = {i: 0 for i in self.caches}
        self.frames = 0

    def reset(self) -> None:
        for i, c in self.caches.items():
            c.reset()
            self.position[i] = 0
        self.frames = 0

    def slot_counts(self, n_frames: int) -> tuple[int, ...]:
        """Cache slots each stage attends over for the next chunk of n_frames.

        Until a ring is full only a prefix of its slots holds keys, so attending over that
        prefix gives the same result for less work (the first chunk of a short clip sees just
        its own rows; a streamed utterance shorter than the windows never pays for them).
        Counts are rounded up (`prefix`) so few distinct graphs arise.
        """
        if self.prefix == "full":
            return tuple(c.capacity for c in self.caches.values())
        filled = self.frames + n_frames
        if self.prefix == "doubling":
            filled = max(self.max_frames, 1 << (filled - 1).bit_length())
        filled = _round_up(filled, self.max_frames)
        return tuple(min(c.capacity, _round_up(filled * self.per_frame[i], SLOT_ALIGN))
                     for i, c in self.caches.items())

    def graph_inputs(self, g: Graph, n_frames: int, counts: tuple[int, ...]) -> dict[int, dict]:
        """Per transformer stage: positions, slots and mask inputs of a chunk of n_frames."""
        out = {}
        for (i, cache), n_slots in zip(self.caches.items(), counts):
            t = n_frames * self.per_frame[i]
            out[i] = {"positions": g.input(f"{self.name}.{i}.pos", (t,), I32),
                      "slots": g.input(f"{self.name}.{i}.slots", (t,), I32),
                      "mask": g.input(f"{self.name}.{i}.mask", (t, n_slots), F16),
                      "n_slots": n_slots}
        return out

    def advance(self, n_frames: int, counts: tuple[int, ...]) -> dict[str, np.ndarray]:
        """Host side of the next chunk: reserve ring slots and build each stage's window mask."""
        feed = {}
        for (i, cache), n_slots in zip(self.caches.items(), counts):
            t = n_frames * self.per_frame[i]
            pos = np.arange(self.position[i], self.position[i] + t)
            feed[f"{self.name}.{i}.pos"] = pos.astype(np.int32)
            feed[f"{self.name}.{i}.slots"] = cache.reserve(pos, ring=True)
            feed[f"{self.name}.{i}.mask"] = cache.mask(pos, window=self.stages[i].context,
                                                        n_slots=n_slots, dtype=np.float16)
            self.position[i] += t
        self.frames += n_frames
        return feed

    def close(self) -> None:
        for c in self.caches.values():
            c.close()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def positions_per_frame(cfg: CodecConfig, tower: str) -> list[int]:
    """Sequence positions one code frame spans at the input of each stage of a tower."""
    per, out = (cfg.stream_samples_per_frame if tower == "encoder" else 1), []
    for s in getattr(cfg, tower):
        out.append(per)
        if s.kind == PATCH:
            per = per // s.patch if tower == "encoder" else per * s.patch
    return out


def run_tower(x: Tensor, stages: list, cfg: CodecConfig, state: TowerState | Sequence[TowerState],
              stage_inputs: dict[int, dict] | Sequence[dict[int, dict]]) -> Tensor:
    """x [D, T] through every stage of a tower (patches fold time into channels or back).
    Several streams (a state and its stage inputs each, their rows one stream after another,
    whole frames each): patches are frame-local, so each stream's rows stay together."""
    states = (state,) if isinstance(state, TowerState) else tuple(state)
    inputs = (stage_inputs,) if isinstance(state, TowerState) else tuple(stage_inputs)
    tower = states[0].tower
    for i, stage in enumerate(stages):
        if isinstance(stage, StageConfig):
            x = patchify(x, stage.patch) if tower == "encoder" else unpatchify(x, stage.patch)
            continue
        caches = tuple(s.caches[i] for s in states)
        own = tuple(inp[i] for inp in inputs)
        if len(states) == 1:
            caches, own = caches[0], own[0]
        x = transformer_stage(x, stage, cfg, caches=caches, inputs=own, name=f"{tower}.{i}")
    return x
