"""ops.mul_mat in a `rowwise` graph (moss_tts/ggml/rowwise.py, issue 31): each row's product is
the same, bit for bit, whatever number of rows it is multiplied with, for every weight type
and repacked weight this host's ggml has — what lets a stream decoded among others compute
what it computes alone. Guard: a plain graph's products do move with the row count (ggml picks
its kernel by it), so the equality is the plan's doing."""

import gguf
import numpy as np
import pytest

from moss_tts.ggml import Graph, Weights, get_backend, ops, repack
from moss_tts.ggml.quant import quantize
from moss_tts.ggml.types import GGMLType

from .test_weights import write_gguf

K, N, MOST = 512, 64, 9
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q5_1", "iq4_nl", "q4_K", "q6_K"]


def weights_file(path, qtype: str):
    w = (np.random.default_rng(3).standard_normal((N, K)) / 20).astype(np.float32)
    if qtype == "f32":
        raw, gtype = w, gguf.GGMLQuantizationType.F32
    elif qtype == "f16":
        raw, gtype = w.astype(np.float16), gguf.GGMLQuantizationType.F16
    else:
        raw, gtype = quantize(w, qtype), gguf.GGMLQuantizationType[qtype.upper()]
    write_gguf(path, {"blk.0.w": (raw, raw.shape, gtype)})
    return path


def products(weights, x, rowwise: bool) -> np.ndarray:
    with Graph(weights.backend, name="rowwise-test", rowwise=rowwise) as g:
        g.output(ops.mul_mat(weights["blk.0.w"], g.input("x", x.shape)), "y", ndim=2)
        return g.run({"x": x})["y"]


def check_rowwise(weights, qtype: str) -> None:
    x = np.random.default_rng(4).standard_normal((MOST, K)).astype(np.float32)
    alone = np.concatenate([products(weights, x[j:j + 1], True) for j in range(MOST)])
    for n in range(2, MOST + 1):
        assert np.array_equal(products(weights, x[:n], True), alone[:n]), f"{qtype}: {n} rows"


@pytest.mark.parametrize("qtype", TYPES)
def test_each_rows_product_is_the_same_whatever_rows_go_with_it(tmp_path, qtype):
    with Weights.load(weights_file(tmp_path / "w.gguf", qtype), get_backend(None, 2)) as w:
        check_rowwise(w, qtype)


def test_so_is_a_repacked_weights(tmp_path):
    """Every type this host repacks (ggml decides by CPU: q4_0 and iq4_nl with AVX2, q4_K
    and q2_K too; their multi-row kernels are other kernels again)."""
    backend = get_backend(None, 2)
    packer = repack.Packer(backend)
    packed = [t for t in ("q4_0", "iq4_nl", "q4_K", "q2_K")
              if packer.eligible(GGMLType.parse(t), (K, N, 1, 1))]
    assert packed, "this host repacks none: the CPU_REPACK kernels go untested"
    for qtype in packed:
        with Weights.load(weights_file(tmp_path / f"{qtype}.gguf", qtype), backend,
                          repack=lambda name, t: True) as w:
            check_rowwise(w, qtype)


def test_a_plain_graphs_products_move_with_the_row_count(tmp_path):
    """Guard: without the plan, f32 weights' products of one row and of two differ (ggml's
    vec_dot and llamafile's tiled GEMM) on an x86 host with AVX; were they equal, the test
    above would prove nothing."""
    x = np.random.default_rng(4).standard_normal((2, K)).astype(np.float32)
    with Weights.load(weights_file(tmp_path / "w.gguf", "f32"), get_backend(None, 2)) as w:
        one, two = products(w, x[:1], False), products(w, x, False)
    assert not np.array_equal(two[:1], one)
