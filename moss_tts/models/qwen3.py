"""Qwen3 decoder backbone, the one every MOSS-TTS family above Nano shares (HF `Qwen3Model`;
facts in docs/upstream-notes.md §family-1.1). Tensor and metadata names are llama.cpp's,
so the published llama.cpp GGUFs load as they are (design §4).

Pre-norm blocks without biases: x + attn_output(attention(rms(x))), then
x + ffn_down(silu(ffn_gate m) ⊙ ffn_up m); per-head q/k RMSNorm before NEOX RoPE; GQA.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..ggml import ops
from ..ggml.graph import Tensor
from ..nn import CacheView, cached_attention, mlp, project_heads, rms_norm
from . import spec

ARCH = "qwen3"
# Config field (upstream config.json name) → llama.cpp GGUF key
GGUF_KEYS = {
    "hidden_size": f"{ARCH}.embedding_length",
    "num_hidden_layers": f"{ARCH}.block_count",
    "num_attention_heads": f"{ARCH}.attention.head_count",
    "num_key_value_heads": f"{ARCH}.attention.head_count_kv",
    "head_dim": f"{ARCH}.attention.key_length",
    "intermediate_size": f"{ARCH}.feed_forward_length",
    "rope_theta": f"{ARCH}.rope.freq_base",
    "rms_norm_eps": f"{ARCH}.attention.layer_norm_rms_epsilon",
}
LAYER_PREFIX = "blk.{}."                     # llama.cpp
SOURCE_LAYER_PREFIX = "layers.{}."           # HF, below the model's own prefix
# The Qwen tokenizer's special tokens that the MOSS-TTS checkpoints on this backbone give roles
# (docs/upstream-notes.md §family-1.2): the default ids of their configs, declared once here
PAD_ID = 151643                    # <|endoftext|>, the text pad
IM_START_ID, IM_END_ID = 151644, 151645
AUDIO_START_ID, AUDIO_END_ID = 151652, 151653     # Local v1.5 has its own pair (P13)
AUDIO_USER_SLOT_ID = 151654        # a reference frame's row; Realtime's <|audio_pad|>
TEXT_PAD_ID = 151655               # Realtime's <|text_pad|>
AUDIO_ASSISTANT_SLOT_ID = 151656   # a generated frame's row (Delay's GEN slot)
AUDIO_DELAY_SLOT_ID = 151662       # Delay's DELAY slot, the staircase's flush rows


@dataclass(frozen=True)
class Qwen3Config:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float = 1e-6

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"Qwen3: {self.num_attention_heads} attention heads are not a "
                              f"multiple of {self.num_key_value_heads} KV heads")
        if self.head_dim % 2:
            raise ConfigError(f"Qwen3: RoPE needs an even head_dim, got {self.head_dim}")

    @classmethod
    def from_gguf(cls, meta) -> "Qwen3Config":
        return spec.config_from_gguf(cls, meta, ARCH, keys=GGUF_KEYS)

    def to_metadata(self) -> dict:
        return spec.config_to_metadata(self, ARCH, keys=GGUF_KEYS)

    def layer_spec(self) -> tuple[spec.TensorSpec, ...]:
        """One block below `blk.<i>.` (checkpoint: `layers.<i>.`); Linear weights (out, in)."""
        d, f, dh = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * dh, self.num_key_value_heads * dh
        T = spec.TensorSpec
        return (T("attn_norm.weight", (d,), "input_layernorm.weight"),
                T("attn_q.weight", (q, d), "self_attn.q_proj.weight"),
                T("attn_k.weight", (kv, d), "self_attn.k_proj.weight"),
                T("attn_v.weight", (kv, d), "self_attn.v_proj.weight"),
                T("attn_q_norm.weight", (dh,), "self_attn.q_norm.weight"),
                T("attn_k_norm.weight", (dh,), "self_attn.k_norm.weight"),
                T("attn_output.weight", (d, q), "self_attn.o_proj.weight"),
                T("ffn_norm.weight", (d,), "post_attention_layernorm.weight"),
                T("ffn_gate.weight", (f, d), "mlp.gate_proj.weight"),
                T("ffn_up.weight", (f, d), "mlp.up_proj.weight"),
                T("ffn_down.weight", (d, f), "mlp.down_proj.weight"))

    def tensor_shapes(self) -> dict[str, tuple]:
        """Every block tensor and the final norm (embeddings and heads belong to the model)."""
        shapes = {"output_norm.weight": (self.hidden_size,)}
        for i in range(self.num_hidden_layers):
            shapes |= spec.shapes(self.layer_spec(), LAYER_PREFIX.format(i))
        return shapes

    def source_names(self, source_prefix: str) -> dict[str, str]:
        """{checkpoint name: GGUF name} of every tensor in `tensor_shapes`, the checkpoint's
        backbone living below `source_prefix` (`language_model.` for MossTTSDelay)."""
        names = {f"{source_prefix}norm.weight": "output_norm.weight"}
        for i in range(self.num_hidden_layers):
            names |= spec.source_names(self.layer_spec(), LAYER_PREFIX.format(i),
                                       source_prefix + SOURCE_LAYER_PREFIX.format(i))
        return names


@dataclass(frozen=True)
class Qwen3Layer:
    """One block's weights; attribute = llama.cpp tensor name below `blk.<i>.` (C20)."""

    attn_norm_weight: Tensor
    attn_q_weight: Tensor
    attn_k_weight: Tensor
    attn_v_weight: Tensor
    attn_q_norm_weight: Tensor
    attn_k_norm_weight: Tensor
    attn_output_weight: Tensor
    ffn_norm_weight: Tensor
    ffn_gate_weight: Tensor
    ffn_up_weight: Tensor
    ffn_down_weight: Tensor

    @classmethod
    def from_tensors(cls, tensors, il: int, cfg: Qwen3Config) -> "Qwen3Layer":
        return spec.fill_record(cls, tensors, LAYER_PREFIX.format(il), cfg.layer_spec())


def layers_from_tensors(tensors, cfg: Qwen3Config) -> list[Qwen3Layer]:
    return [Qwen3Layer.from_tensors(tensors, i, cfg) for i in range(cfg.num_hidden_layers)]


def self_attention(x: Tensor, layer: Qwen3Layer, cfg: Qwen3Config, *, il: int, kv: CacheView,
                   stage: str, rope_mode: str | None = "neox") -> Tensor:
    """Normed rows x [D, T] → attention output [D, T] (GQA, q/k norm, NEOX RoPE, §family-1.1; no
    RoPE with rope_mode None)."""
    q, k, v = project_heads(x, layer.attn_q_weight, layer.attn_k_weight, layer.attn_v_weight,
                            n_head=cfg.num_attention_heads, n_kv_head=cfg.num_key_value_heads,
                            head_dim=cfg.head_dim)
    o = cached_attention(q, k, v, kv, il, rope_mode=rope_mode, rope_base=cfg.rope_theta,
                         q_norm=layer.attn_q_norm_weight, k_norm=layer.attn_k_norm_weight,
                         norm_eps=cfg.rms_norm_eps)
    ops.name(o, f"{stage}.{il}.attn_out")
    return ops.mul_mat(layer.attn_output_weight, o)


def block(x: Tensor, layer: Qwen3Layer, cfg: Qwen3Config, *, il: int, kv: CacheView,
          stage: str, rope_mode: str | None = "neox") -> Tensor:
    """One pre-norm Qwen3 block, x [D, T] → [D, T]."""
    eps = cfg.rms_norm_eps
    x = x + self_attention(rms_norm(x, layer.attn_norm_weight, eps=eps), layer, cfg, il=il,
                           kv=kv, stage=stage, rope_mode=rope_mode)
    m = rms_norm(x, layer.ffn_norm_weight, eps=eps)
    x = x + mlp(m, layer.ffn_up_weight, layer.ffn_down_weight, activation="silu",
                w_gate=layer.ffn_gate_weight)
    return ops.name(x, f"{stage}.{il}.out")


def forward(x: Tensor, layers: list[Qwen3Layer], norm: Tensor, cfg: Qwen3Config, *,
            kv: CacheView, stage: str = "backbone", rope_mode: str | None = "neox") -> Tensor:
    """Embedded rows x [D, T] through every block and the final RMSNorm → hidden [D, T]
    (rope_mode None: a stack without positional encoding, MossTTSLocal's depth transformer)."""
    for il, layer in enumerate(layers):
        x = block(x, layer, cfg, il=il, kv=kv, stage=stage, rope_mode=rope_mode)
    return ops.name(rms_norm(x, norm, eps=cfg.rms_norm_eps), f"{stage}.hidden")
