"""moss_tts/ggml/sched.py: ggml's scheduler over a device (the RPC backend, memory not the host's)
and the CPU. An op the device is made to lack runs on the CPU, with the copies between the two;
the results equal the CPU backend's alone bit for bit (the same kernels on both sides)."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.errors import BackendError
from moss_tts.ggml import F32, I32, Allocator, Backend, Graph, TensorStore, allocator_for, ops
from moss_tts.ggml.sched import Scheduler

EXACT = 0.0  # the same CPU kernels on each side of the RPC connection


@pytest.fixture
def weights(rng):
    return {"w1": rng.standard_normal((32, 16)).astype(np.float32),
            "w2": rng.standard_normal((16, 32)).astype(np.float32)}


def _block(g, store, x):
    """y = w2 · softmax(w1 · rms_norm(x)) + x: x [16, n] → [16, n]."""
    h = ops.mul_mat(store["w1"], ops.rms_norm(x, 1e-5))        # [32, n]
    return ops.mul_mat(store["w2"], ops.softmax(h)) + x         # [16, n]


def _run(backend, weights, x, *, allocator=None, depth=1):
    """(y, the graph, the weights' store) of `depth` _blocks with the weights on `backend`."""
    store = TensorStore(weights, backend)
    g = Graph(backend, name=f"block{len(x)}x{depth}", allocator=allocator)
    y = xt = g.input("x", x.shape)
    for _ in range(depth):
        y = _block(g, store, y)
    g.output(y, "y", ndim=2)
    y = g.run({"x": x})["y"]
    return y, g, store


@pytest.mark.parametrize("lacks", [frozenset(), frozenset({"SOFT_MAX"}),
                                   frozenset({"RMS_NORM", "ADD"})])
def test_scheduled_graph_equals_cpu_with_ops_on_the_cpu(rpc, cpu, weights, rng, lacks):
    x = rng.standard_normal((5, 16)).astype(np.float32)
    want, _, _ = _run(cpu, weights, x)
    with Scheduler(rpc, cpu, lacks=lacks) as sched:
        got, g, store = _run(rpc, weights, x, allocator=sched)
        assert_close(got, want, atol=EXACT, what=f"scheduled block, CPU ops {sorted(lacks)}")
        # lacking ops split the graph between the backends; none: one piece on the device
        assert (sched.n_splits > 1) == bool(lacks)
        softmax_on = sched.backend_of(_node(g, "SOFT_MAX"))
        assert softmax_on == ("CPU" if "SOFT_MAX" in lacks else rpc.name)
        # replay: a new input through the same allocation
        x2 = x + 0.25
        again = g.run({"x": x2})["y"]
        assert_close(again, _run(cpu, weights, x2)[0], atol=EXACT, what="replayed block")
        assert_differs(again, want, atol=1e-3, what="replay with a shifted input")
        g.close(), store.close()


def _node(g, op):
    L = g.lib
    for i in range(g.n_nodes):
        node = L.ggml_graph_node(g.cgraph, i)
        if L.ggml_op_desc(node).decode() == op:
            return type("Node", (), {"ptr": node})()
    raise AssertionError(f"no {op} node in {g.name}")


def test_graphs_taking_turns_and_growing_on_one_scheduler(rpc, cpu, weights, rng):
    """Graph A, a larger B (more rows, three blocks: the scheduler is made again for it),
    then A again: each is allocated anew, split anew, and still computes its own result."""
    small, large = (rng.standard_normal((n, 16)).astype(np.float32) for n in (2, 40))
    with Scheduler(rpc, cpu, lacks=frozenset({"SOFT_MAX"})) as sched:
        a, ga, sa = _run(rpc, weights, small, allocator=sched)
        b, gb, sb = _run(rpc, weights, large, allocator=sched, depth=3)
        a2 = ga.run({"x": small})["y"]
        assert sched.current is ga
        for got, x, depth in ((a, small, 1), (b, large, 3), (a2, small, 1)):
            assert_close(got, _run(cpu, weights, x, depth=depth)[0], atol=EXACT,
                         what=f"{len(x)} rows x {depth} blocks")
        for r in (ga, gb, sa, sb):
            r.close()


def test_an_op_writing_into_device_memory_cannot_fall_back(rpc, cpu, rng):
    cache = TensorStore({"k": ((8, 16), F32)}, rpc)
    with Scheduler(rpc, cpu, lacks=frozenset({"SET_ROWS"})) as sched, \
            Graph(rpc, name="write", allocator=sched) as g:
        src = g.input("src", (1, 16))
        rows = g.input("rows", (1,), dtype=I32)
        ops.set_rows(cache["k"], src, rows)
        g.output(ops.scale(src, 2.0), "y")
        with pytest.raises(BackendError, match="SET_ROWS writes into device memory"):
            g.allocate()
    cache.close()


def test_a_scheduler_needs_a_device_beside_the_cpu(cpu):
    with pytest.raises(BackendError, match="needs a device backend beside the CPU"):
        Scheduler(cpu, cpu)


def test_only_a_device_gets_a_scheduler(rpc_server, rpc, cpu):
    """The CPU keeps its own allocator (nothing changes for a CPU-only run); a device's graphs
    go through the scheduler, with the ops it is said to lack."""
    with allocator_for(cpu) as own, allocator_for(rpc) as scheduled:
        assert type(own) is Allocator and type(scheduled) is Scheduler
    with Backend(rpc_server.name, lacks=frozenset({"ROPE"})) as lacking, allocator_for(lacking) as s:
        assert s.lacks == {"ROPE"}
    with pytest.raises(BackendError, match="the CPU has them all"):
        Backend("cpu", lacks=frozenset({"ROPE"}))
