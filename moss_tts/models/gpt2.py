"""GPT-2 backbone with rotary positions (no learned wpe), as in MOSS-TTS-Nano's global and
local transformers (upstream `MossTTSNanoGPT2Model`; facts in docs/upstream-notes.md §nano-2).

Pre-LN blocks: x + c_proj(attn(ln_1 x)), then x + fc_out(act(fc_in(ln_2 x))); fused QKV
split q|k|v; RoPE on interleaved pairs over the full head dim; K cached after RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..ggml import ops
from ..ggml.graph import Graph, Tensor
from ..nn import CacheView, KVCache, cached_attention, fused_heads, layer_norm, linear, mlp
from . import spec

# far beyond any real backbone, far below what a corrupt file could make the loader loop over
MAX_WIDTH, MAX_LAYERS = 1 << 16, 1 << 10
# HF `activation_function` → nn.mlp activation: Nano's gelu_new; Local v1.5's local block silu
ACTIVATIONS = {"gelu_new": "gelu_tanh", "silu": "silu"}


@dataclass(frozen=True)
class GPT2Config:
    n_embd: int
    n_head: int
    n_layer: int
    n_inner: int | None = None          # None → 4·n_embd, as in HF GPT2Config
    layer_norm_epsilon: float = 1e-5
    rope_base: float = 10000.0
    activation_function: str = "gelu_new"

    def __post_init__(self):
        if not (1 <= self.n_head <= self.n_embd <= MAX_WIDTH and 0 <= self.n_layer <= MAX_LAYERS):
            raise ConfigError(f"GPT-2: n_embd {self.n_embd}, n_head {self.n_head}, n_layer "
                              f"{self.n_layer} are out of range (a corrupt file?)")
        if self.n_embd % self.n_head:
            raise ConfigError(f"GPT-2: n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        if self.head_dim % 2:
            raise ConfigError(f"GPT-2: RoPE needs an even head_dim, got {self.head_dim}")
        if self.activation_function not in ACTIVATIONS:
            raise ConfigError(f"GPT-2: activation {self.activation_function!r} is not supported "
                              f"(MOSS checkpoints use {' or '.join(ACTIVATIONS)})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @classmethod
    def from_gguf(cls, meta, prefix: str) -> "GPT2Config":
        """Read `<prefix>.<field>` for every field; absent optional fields keep their default."""
        return spec.config_from_gguf(cls, meta, prefix)

    def layer_spec(self) -> tuple[spec.TensorSpec, ...]:
        """One block's tensors below `<prefix>.h.<i>.`, upstream spelling (design §4); Linear
        weights (out, in)."""
        d, f = self.n_embd, self.ffn_dim
        T = spec.TensorSpec
        return (T("ln_1.weight", (d,)), T("ln_1.bias", (d,)),
                T("attn.c_attn.weight", (3 * d, d)), T("attn.c_attn.bias", (3 * d,)),
                T("attn.c_proj.weight", (d, d)), T("attn.c_proj.bias", (d,)),
                T("ln_2.weight", (d,)), T("ln_2.bias", (d,)),
                T("mlp.fc_in.weight", (f, d)), T("mlp.fc_in.bias", (f,)),
                T("mlp.fc_out.weight", (d, f)), T("mlp.fc_out.bias", (d,)))

    def layer_shapes(self) -> dict[str, tuple]:
        """numpy shapes of one block's tensors by name."""
        return spec.shapes(self.layer_spec())


@dataclass(frozen=True)
class GPT2Layer:
    """One block's weights; attribute = tensor name below the layer prefix, dots → underscores."""

    ln_1_weight: Tensor
    ln_1_bias: Tensor
    attn_c_attn_weight: Tensor
    attn_c_attn_bias: Tensor
    attn_c_proj_weight: Tensor
    attn_c_proj_bias: Tensor
    ln_2_weight: Tensor
    ln_2_bias: Tensor
    mlp_fc_in_weight: Tensor
    mlp_fc_in_bias: Tensor
    mlp_fc_out_weight: Tensor
    mlp_fc_out_bias: Tensor

    @classmethod
    def from_tensors(cls, tensors, prefix: str, cfg: GPT2Config) -> "GPT2Layer":
        return spec.fill_record(cls, tensors, prefix, cfg.layer_spec())


def self_attention(x: Tensor, layer: GPT2Layer, cfg: GPT2Config, *, il: int, kv: CacheView,
                   stage: str) -> Tensor:
    """x [D, T] → attention output [D, T], writing this graph's K/V into layer il of kv.cache
    (kv.mask F16 for the fused flash-attention path, the default: no V transpose per step)."""
    qkv = linear(x, layer.attn_c_attn_weight, layer.attn_c_attn_bias)      # [3D, T]
    q, k, v = fused_heads(qkv, n_head=cfg.n_head)
    # RoPE on interleaved pairs over the full head dim (docs/upstream-notes.md §nano-2.3)
    o = cached_attention(q, k, v, kv, il, rope_mode="normal", rope_base=cfg.rope_base)
    ops.name(o, f"{stage}.{il}.attn_out")
    return linear(o, layer.attn_c_proj_weight, layer.attn_c_proj_bias)


def block(x: Tensor, layer: GPT2Layer, cfg: GPT2Config, *, il: int, kv: CacheView,
          stage: str) -> Tensor:
    """One pre-LN GPT-2 block, x [D, T] → [D, T]."""
    eps = cfg.layer_norm_epsilon
    h = layer_norm(x, layer.ln_1_weight, layer.ln_1_bias, eps=eps)
    x = x + self_attention(h, layer, cfg, il=il, kv=kv, stage=stage)
    h = layer_norm(x, layer.ln_2_weight, layer.ln_2_bias, eps=eps)
    x = x + mlp(h, layer.mlp_fc_in_weight, layer.mlp_fc_out_weight,
                activation=ACTIVATIONS[cfg.activation_function],
                b_in=layer.mlp_fc_in_bias, b_out=layer.mlp_fc_out_bias)
    return ops.name(x, f"{stage}.{il}.out")


def forward(x: Tensor, layers: list[GPT2Layer], ln_f: tuple[Tensor, Tensor], cfg: GPT2Config, *,
            kv: CacheView, stage: str = "backbone") -> Tensor:
    """Embedded rows x [D, T] through every block and ln_f → hidden [D, T]."""
    for il, layer in enumerate(layers):
        x = block(x, layer, cfg, il=il, kv=kv, stage=stage)
    x = layer_norm(x, ln_f[0], ln_f[1], eps=cfg.layer_norm_epsilon)
    return ops.name(x, f"{stage}.hidden")


def build_cached_graph(g: Graph, weights, cfg: GPT2Config, cache: KVCache, n_rows: int,
                       n_slots: int, *, flash: bool = True) -> Graph:
    """The backbone on its own as a graph: inputs "x" (n_rows, D) embedded rows and the cache
    inputs "kv.*" (see `cached_feed`); output "hidden" (n_rows, D). Tensor names `h.<i>.*`,
    `ln_f.*`."""
    x = g.input("x", (n_rows, cfg.n_embd))
    kv = CacheView.inputs(g, cache, n_rows, n_slots, flash=flash)
    layers = [GPT2Layer.from_tensors(weights, f"h.{i}.", cfg) for i in range(cfg.n_layer)]
    h = forward(x, layers, (weights["ln_f.weight"], weights["ln_f.bias"]), cfg, kv=kv)
    g.output(h, "hidden", ndim=2)
    return g.build()


def cached_feed(cache: KVCache, x: np.ndarray, positions, n_slots: int, *,
                flash: bool = True) -> dict[str, np.ndarray]:
    """Host inputs of `build_cached_graph` for rows x at `positions` (reserves their slots)."""
    return {"x": x} | cache.feed(positions, n_slots, flash=flash)
