"""ggml's CPU_REPACK buffer type through Weights.load(repack=...): which tensors ggml repacks on
this host, mul_mat on them against the plain path and a numpy reference, read-back, and the
guard that keeps every other op away from the interleaved bytes."""

import gguf
import numpy as np
import pytest

from fixtures.compare import assert_close
from moss_tts.errors import InputError, ShapeError
from moss_tts.ggml import I32, Graph, Weights, get_backend, ops, repack
from moss_tts.ggml.quant import quantize
from moss_tts.ggml.types import GGMLType

from .test_weights import write_gguf

K = 512
# Repacked vs plain mul_mat: both quantize the activations to the same 8-bit blocks (q8_0 for
# q4_0 / iq4_nl, q8_K for the K-quants); only the f32 accumulation order differs. Measured
# ≤ 4.5e-7 × max|y| for 1, 3, 4, 5 and 64 rows of every type below.
PACKED_VS_PLAIN = 5e-6
# Either path against the float64 product of the gguf-dequantized weights: the 8-bit
# activations cost ≤ 0.009 × max|y| (measured, K = 512).
VS_DEQUANTIZED = 0.03
ALL = lambda name, type_: True  # noqa: E731


def quantized_file(path, qtype: str, rows: int, rng):
    w = rng.standard_normal((rows, K)).astype(np.float32)
    raw = quantize(w, qtype)
    gtype = gguf.GGMLQuantizationType[qtype.upper()]
    write_gguf(path, {"blk.0.w": (raw, raw.shape, gtype)})
    return path, gguf.quants.dequantize(raw, gtype).reshape(rows, K)


def matmul(weights, x):
    g = Graph(weights.backend, name="repack-test")
    g.output(ops.mul_mat(weights["blk.0.w"], g.input("x", x.shape)), "y", ndim=2)
    g.build()
    try:
        return g.run({"x": x})["y"]
    finally:
        g.close()


def host_repacks(qtype: str) -> bool:
    return repack.Packer(get_backend()).eligible(GGMLType.parse(qtype), (K, 64, 1, 1))


def test_cpu_backend_lists_cpu_repack_and_the_packer_uses_only_it():
    bufts = repack.extra_buffer_types(get_backend())
    assert repack.CPU_REPACK in bufts
    packer = repack.Packer(get_backend())
    assert packer.available and packer.buft == bufts[repack.CPU_REPACK]


@pytest.mark.parametrize("qtype", ["q4_0", "q4_K", "iq4_nl", "q2_K"])
@pytest.mark.parametrize("m", [1, 5, 64])
def test_repacked_mul_mat_matches_the_plain_path_and_numpy(tmp_path, rng, qtype, m):
    if not host_repacks(qtype):
        pytest.skip(f"this ggml does not repack {qtype} on this CPU")
    path, w = quantized_file(tmp_path / "w.gguf", qtype, 72, rng)
    x = rng.standard_normal((m, K)).astype(np.float32)
    with Weights.load(path) as plain, Weights.load(path, repack=ALL) as packed:
        assert plain.packed == set() and packed.packed == {"blk.0.w"}
        got, want = matmul(packed, x), matmul(plain, x)
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        scale = np.abs(ref).max()
        assert_close(got, want, atol=PACKED_VS_PLAIN * scale, what="repacked vs plain")
        assert_close(got, ref, atol=VS_DEQUANTIZED * scale, what="repacked vs numpy")
        # the interleaved copy cannot be read back: read() serves the file's blocks
        np.testing.assert_array_equal(packed.read("blk.0.w"), w)


@pytest.mark.parametrize("qtype,rows", [("q4_0", 12), ("q4_K", 20), ("q8_0", 64)])
def test_tensors_ggml_cannot_repack_stay_plain_and_right(tmp_path, rng, qtype, rows):
    """Rows not a multiple of the 8-row interleave (ggml would abort on them), and a type
    this ggml does not repack on x86, load mmapped and compute as before."""
    path, w = quantized_file(tmp_path / "w.gguf", qtype, rows, rng)
    x = rng.standard_normal((4, K)).astype(np.float32)
    with Weights.load(path, repack=ALL) as weights:
        assert weights.packed == set() and weights.zero_copy
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        assert_close(matmul(weights, x), ref, atol=VS_DEQUANTIZED * np.abs(ref).max())


def test_predicate_chooses_which_eligible_tensors_repack(tmp_path, rng):
    path, _ = quantized_file(tmp_path / "w.gguf", "q4_0", 64, rng)
    with Weights.load(path, repack=lambda name, type_: name != "blk.0.w") as weights:
        assert weights.packed == set()


@pytest.mark.parametrize("use", ["get_rows", "view"])
def test_a_repacked_weight_read_by_another_op_is_refused_at_build(tmp_path, rng, use):
    path, _ = quantized_file(tmp_path / "w.gguf", "q4_0", 64, rng)
    with Weights.load(path, repack=ALL) as weights:
        t = weights["blk.0.w"]
        g = Graph(weights.backend, name="misuse")
        try:
            if use == "get_rows":
                y = ops.get_rows(t, g.input("ids", (2,), I32))
            else:
                y = ops.mul_mat(ops.view(t, (K, 8), offset=0, graph=g), g.input("x", (4, K)))
            g.output(y, "y")
            with pytest.raises(ShapeError, match="repacked weight 'blk.0.w' is read by"):
                g.build()
        finally:
            g.close()
    # closed: the guard forgets the tensor
    assert not repack.PACKED


def test_switch_and_environment_choose_the_types(monkeypatch):
    monkeypatch.delenv(repack.REPACK_ENV, raising=False)
    assert repack.types() == repack.types(True) == repack.DEFAULT_TYPES
    assert GGMLType.Q4_0 in repack.DEFAULT_TYPES and GGMLType.Q4_K not in repack.DEFAULT_TYPES
    assert repack.types(False) is None
    monkeypatch.setenv(repack.REPACK_ENV, "0")
    assert repack.types() is None and repack.types(True) == repack.DEFAULT_TYPES
    monkeypatch.setenv(repack.REPACK_ENV, "all")
    assert GGMLType.Q4_K in repack.types() and repack.types(False) is None
    monkeypatch.setenv(repack.REPACK_ENV, "maybe")
    with pytest.raises(InputError, match="MOSS_TTS_REPACK='maybe'"):
        repack.types()


def rss_file_kib() -> int:
    """File-backed resident pages of this process (/proc/self/status RssFile)."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("RssFile:"))


def test_repacked_weights_do_not_keep_their_file_pages_resident(tmp_path, rng):
    """The repack copies the weights into anonymous memory; the mapped file pages it read are
    dropped again, so a repacked model costs its size once in RSS, not twice."""
    path, _ = quantized_file(tmp_path / "w.gguf", "q4_0", 16384, rng)   # 4.5 MiB of blocks
    nbytes = path.stat().st_size
    before = rss_file_kib()
    with Weights.load(path, repack=ALL) as weights:
        assert weights.packed == {"blk.0.w"}
        assert (rss_file_kib() - before) * 1024 < nbytes // 4


def test_graphs_without_repacked_weights_skip_the_node_walk(tmp_path, rng, monkeypatch):
    """While a repacked model is loaded, other graphs (a codec's, another model's) are told
    apart by a numpy scan of their tensor metadata, not walked node by node."""
    path, _ = quantized_file(tmp_path / "w.gguf", "q4_0", 64, rng)
    with Weights.load(path, repack=ALL) as weights:
        walked = []
        lib = weights.lib
        real = lib.ggml_graph_node
        monkeypatch.setattr(lib, "ggml_graph_node", lambda *a: walked.append(a) or real(*a))
        for uses in (False, True):
            g = Graph(weights.backend, name="other")
            x = g.input("x", (4, K))
            g.output(ops.mul_mat(weights["blk.0.w"], x) if uses else ops.add(x, x), "y")
            g.build()
            g.close()
            assert bool(walked) == uses
