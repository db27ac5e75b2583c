"""Residual LFQ quantizer (codecs.md §1.6): the code search on the unit sphere and the decode
sum, both inside the graph (no host round trip per codebook).

Encode, per frame: r = W_in z + b_in; for each codebook i: ê = normalize(A_i r + a_i);
k_i = argmin ‖ê − Ĉ_ij‖² = argmax (2 ê·Ĉ_ij − ‖Ĉ_ij‖²) over the normalized codebook Ĉ_i;
r −= B_i C_i[k_i] + b_i (the RAW codebook row through out_proj, bias included).
Decode: y = W_out Σ_{i<k} (B_i C_i[c_i] + b_i) + b_out.
"""

from __future__ import annotations

import numpy as np

from ..ggml import ops
from ..ggml.graph import Tensor
from ..ggml.weights import TensorStore
from ..nn import linear
from .config import CodecConfig

L2_EPS = 1e-12  # F.normalize


def derived_tables(weights, cfg: CodecConfig, backend) -> TensorStore:
    """Per codebook: the normalized codebook Ĉ_i, its squared row norms, and the decode table
    T_i = C_i B_iᵀ + b_i (each code's out_proj output, so decoding is a gather)."""
    arrays = {}
    for i in range(cfg.n_quantizers):
        p = f"quantizer.quantizers.{i}."
        c = weights.read(p + "codebook.weight").astype(np.float64)           # (K, c)
        c_hat = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), L2_EPS)
        b = weights.read(p + "out_proj.weight").astype(np.float64)           # (r, c)
        arrays[f"rlfq.{i}.unit_codebook"] = c_hat.astype(np.float32)
        arrays[f"rlfq.{i}.unit_norm2"] = (c_hat ** 2).sum(axis=1).astype(np.float32)
        arrays[f"rlfq.{i}.decode_table"] = (c @ b.T + weights.read(p + "out_proj.bias")).astype(np.float32)
    return TensorStore(arrays, backend)


def quantize(z: Tensor, weights, tables: TensorStore, n_q: int) -> list[Tensor]:
    """Latent z [code_dim, N] → one I32 code vector [N] per codebook i < n_q."""
    r = linear(z, weights["quantizer.input_proj.weight"], weights["quantizer.input_proj.bias"])
    codes = []
    for i in range(n_q):
        p = f"quantizer.quantizers.{i}."
        e = linear(r, weights[p + "in_proj.weight"], weights[p + "in_proj.bias"])   # [c, N]
        e = ops.l2_norm(e, L2_EPS)
        # 2 ê·Ĉ − ‖Ĉ‖²: the distance without the per-frame constant ‖ê‖²; argmax keeps the
        # first index on ties, like torch's max over −dist
        score = ops.sub(ops.scale(ops.mul_mat(tables[f"rlfq.{i}.unit_codebook"], e), 2.0),
                        tables[f"rlfq.{i}.unit_norm2"])                               # [K, N]
        k = ops.argmax(score)                                                         # [N] I32
        codes.append(k)
        if i + 1 < n_q:
            r = ops.sub(r, ops.get_rows(tables[f"rlfq.{i}.decode_table"], k))
    return codes


def dequantize(codes: list[Tensor], weights, tables: TensorStore) -> Tensor:
    """I32 code vectors [N] of the first k codebooks → latent [code_dim, N]."""
    total = None
    for i, c in enumerate(codes):
        q = ops.get_rows(tables[f"rlfq.{i}.decode_table"], c)                       # [r, N]
        total = q if total is None else ops.add(total, q)
    return linear(total, weights["quantizer.output_proj.weight"], weights["quantizer.output_proj.bias"])
