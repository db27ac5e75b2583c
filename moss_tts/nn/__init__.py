"""Shared layers as functions over ggml Tensors (style C14): codecs and every TTS variant."""

from .attention import (attention, cached_attention, cached_self_attention, fused_heads,
                        merge_heads, project_heads, split_heads)
from .embeddings import embedding, masked_embedding_sum
from .kv_cache import CacheView, KVCache, causal_mask
from .linear import layer_scale, linear
from .mlp import mlp
from .norms import head_rms_norm, layer_norm, rms_norm
from .patch import patchify, unpatchify
from .rope import rope
from .select import last_row

__all__ = ["CacheView", "KVCache", "attention", "cached_attention", "cached_self_attention",
           "causal_mask", "fused_heads", "merge_heads", "project_heads", "split_heads",
           "embedding", "masked_embedding_sum", "layer_scale", "linear", "mlp", "head_rms_norm",
           "layer_norm", "rms_norm", "patchify", "unpatchify", "rope", "last_row"]
