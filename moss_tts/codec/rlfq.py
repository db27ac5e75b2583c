"""Residual LFQ quantizer (docs/upstream-notes.md §codecs-1.6): the code search on the unit sphere
and the decode sum, both inside the graph (no host round trip per codebook).

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
    """Per codebook: the normalized codebook Ĉ_i and its squared row norms; and one decode
    table stacking T_i = C_i B_iᵀ + b_i for every i (each code's out_proj output), so a frame
    decodes with a single gather of rows c_i + i·K."""
    arrays, decode = {}, []
    for i in range(cfg.n_quantizers):
        p = f"quantizer.quantizers.{i}."
        c = weights.read(p + "codebook.weight").astype(np.float64)           # (K, c)
        c_hat = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), L2_EPS)
        b = weights.read(p + "out_proj.weight").astype(np.float64)           # (r, c)
        arrays[f"rlfq.{i}.unit_codebook"] = c_hat.astype(np.float32)
        arrays[f"rlfq.{i}.unit_norm2"] = (c_hat ** 2).sum(axis=1).astype(np.float32)
        decode.append(c @ b.T + weights.read(p + "out_proj.bias"))
    arrays["rlfq.decode_table"] = np.concatenate(decode).astype(np.float32)  # (n_q·K, r)
    return TensorStore(arrays, backend)


def decode_table(tables: TensorStore, i: int, graph) -> Tensor:
    """Codebook i's block of the stacked decode table, [r, K]."""
    t, k = tables["rlfq.decode_table"], tables[f"rlfq.{i}.unit_codebook"].ne[1]
    return ops.view(t, (t.ne[0], k), (t.nb[1],), i * k * t.nb[1], graph=graph)


def stacked_ids(codes: np.ndarray, codebook_size: int) -> np.ndarray:
    """Codes [k, N] → I32 rows [k·N] of the stacked decode table (codebook-major)."""
    k = codes.shape[0]
    offsets = (np.arange(k, dtype=np.int32) * codebook_size)[:, None]
    return (codes + offsets).reshape(-1).astype(np.int32)


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
            r = ops.sub(r, ops.get_rows(decode_table(tables, i, z.graph), k))
    return codes


def dequantize(ids: Tensor, n_q: int, weights, tables: TensorStore) -> Tensor:
    """Stacked-table rows [n_q·N] (`stacked_ids`) of the first n_q codebooks → latent
    [code_dim, N]: one gather, then the sum over codebooks as a row sum."""
    n = ids.ne[0] // n_q
    rows = ops.get_rows(tables["rlfq.decode_table"], ids)                    # [r, n_q·N]
    r = rows.ne[0]
    # [r, N, n_q] → [n_q, r, N] so the codebook sum runs along rows
    per_q = ops.cont(ops.permute(ops.reshape(rows, r, n, n_q), 1, 2, 0))
    total = ops.reshape(ops.sum_rows(per_q), r, n)                           # [r, N]
    return linear(total, weights["quantizer.output_proj.weight"], weights["quantizer.output_proj.bias"])
