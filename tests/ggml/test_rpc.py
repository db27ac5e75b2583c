"""moss_tts/ggml/rpc.py: ggml's RPC backend as a device whose memory is not the host's. The
server runs the same CPU kernels, so every result equals the CPU backend's bit for bit."""

import gguf
import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.errors import BackendError
from moss_tts.ggml import F16, F32, Backend, Graph, TensorStore, Weights, ops
from moss_tts.ggml.quant import quantize
from moss_tts.ggml.rpc import LocalServer, endpoint_of
from tests.ggml.test_weights import write_gguf

EXACT = 0.0  # the same CPU kernels, one thread on each side: bit-equal


def _mul_mat(backend, w, x, *, weight_type=F32):
    """y = x · wᵀ with w persistent on `backend` (uploaded once), x a graph input."""
    with TensorStore({"w": w.astype(np.float16 if weight_type == F16 else np.float32)},
                     backend) as store, Graph(backend, name="mm") as g:
        xt = g.input("x", x.shape)
        y = g.output(ops.mul_mat(store["w"], xt), "y", ndim=2)
        return g.run({"x": x})["y"], store["w"].on_host, (xt.on_host, y.on_host)


@pytest.mark.parametrize("weight_type", [F32, F16])
@pytest.mark.parametrize("rows", [1, 7])
def test_mul_mat_on_rpc_equals_cpu(rpc, cpu, rng, weight_type, rows):
    w = rng.standard_normal((24, 64)).astype(np.float32)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    got, _, _ = _mul_mat(rpc, w, x, weight_type=weight_type)
    want, _, _ = _mul_mat(cpu, w, x, weight_type=weight_type)
    assert got.shape == (rows, 24)
    assert_close(got, want, atol=EXACT, what=f"rpc mul_mat {weight_type.name}")
    # guard: the RPC result follows its input (not a stale buffer from the previous run)
    moved, _, _ = _mul_mat(rpc, w, x + 0.5, weight_type=weight_type)
    assert_differs(moved, want, atol=1e-3, what="rpc mul_mat of a shifted input")


def test_rpc_tensors_are_not_host_memory(rpc, cpu, rng):
    w, x = rng.standard_normal((4, 32)), rng.standard_normal((2, 32))
    assert not rpc.is_host and not rpc.is_cpu
    # the weight and the product on the server; the graph input is written on the host and
    # copied over by the scheduler (sched.py), as on a GPU
    _, weight_on_host, (input_on_host, output_on_host) = _mul_mat(rpc, w, x)
    assert (weight_on_host, input_on_host, output_on_host) == (False, True, False)
    _, weight_on_host, (input_on_host, output_on_host) = _mul_mat(cpu, w, x)
    assert (weight_on_host, input_on_host, output_on_host) == (True, True, True)


def test_gguf_weights_are_uploaded_to_rpc_and_compute_as_on_cpu(tmp_path, rpc, cpu, rng):
    wq = rng.standard_normal((16, 64)).astype(np.float32)
    raw = quantize(wq, "q8_0")
    path = write_gguf(tmp_path / "w.gguf", {
        "q": (raw, raw.shape, gguf.GGMLQuantizationType.Q8_0),
        "f": rng.standard_normal((8, 64)).astype(np.float32)})
    x = rng.standard_normal((3, 64)).astype(np.float32)
    results = {}
    for backend in (rpc, cpu):
        with Weights.load(path, backend) as weights, Graph(backend, name="w") as g:
            xt = g.input("x", x.shape)
            g.output(ops.mul_mat(weights["q"], xt), "q")
            g.output(ops.mul_mat(weights["f"], xt), "f")
            results[backend.name] = (g.run({"x": x}), (weights.zero_copy, weights.maps_file,
                                     weights["q"].on_host), weights.read("f"))
    (got, rpc_memory, rpc_f), (want, cpu_memory, cpu_f) = results[rpc.name], results[cpu.name]
    assert rpc_memory == (False, False, False)   # uploaded into the server's memory, file unmapped
    assert cpu_memory == (True, True, True)      # the CPU keeps its zero-copy mmap
    for name in ("q", "f"):
        assert_close(got[name], want[name], atol=EXACT, what=f"rpc weight {name}")
    assert_close(rpc_f, cpu_f, atol=EXACT, what="weight read back from the server")


@pytest.mark.parametrize("name", ["rpc://", "rpc://localhost", "rpc://:50052", "rpc://h:0",
                                  "rpc://h:70000", "rpc://h:port"])
def test_malformed_rpc_names_raise_backend_error(name):
    with pytest.raises(BackendError, match="expected rpc://HOST:PORT"):
        endpoint_of(name)


def test_rpc_name_with_no_server_raises_backend_error():
    with LocalServer() as server:
        name = server.name
    # ggml would abort the process on a refused connection: the binding checks first
    with pytest.raises(BackendError, match="no RPC server answers at 127.0.0.1"):
        Backend(name)
