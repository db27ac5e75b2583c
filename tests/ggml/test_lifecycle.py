"""The smallest proofs that the binding works: load, layout, graph lifecycle, reuse, errors."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.errors import BackendError, InputError, ShapeError
from moss_tts.ggml import Backend, Graph, I32, lib, ops

EXACT_F32 = 1e-6  # a handful of f32 multiply-adds
REPO = Path(__file__).resolve().parents[2]


def _run_python(code: str, lib_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "MOSS_TTS_GGML_LIB_DIR": str(lib_dir)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=str(REPO))


def test_manifest_libraries_load_and_version_matches():
    L = lib.get()
    manifest = lib.read_manifest()
    assert L.ggml_version().decode() == manifest["ggml_version"]
    assert "cpu" in [b.lower() for b in manifest["backends"]]


def test_tensor_struct_layout_matches_ggml_accessors():
    # _check_tensor_layout ran at load; re-run it to make the claim explicit.
    lib._check_tensor_layout(lib.get())


def test_smallest_graph_x_squared_times_a_plus_b_is_16():
    # x² · a + b with x = 2, a = 3, b = 4 → 16 (the first test of ggml-python, for the same reason)
    with Graph(name="tiny") as g:
        x = g.input("x", (1,))
        a = g.input("a", (1,))
        b = g.input("b", (1,))
        g.output(ops.mul(ops.sqr(x), a) + b, "f")
        out = g.run({"x": [2.0], "a": [3.0], "b": [4.0]})["f"]
    assert out.shape == (1,) and out[0] == 16.0


def test_graph_reused_with_new_inputs_gives_new_results(rng):
    g = Graph(name="reuse")
    x = g.input("x", (4, 8))
    w = g.input("w", (3, 8))
    g.output(ops.mul_mat(w, x), "y").ne
    g.build()
    n_nodes = g.n_nodes
    for _ in range(3):
        xv = rng.standard_normal((4, 8)).astype(np.float32)
        wv = rng.standard_normal((3, 8)).astype(np.float32)
        assert_close(g.run({"x": xv, "w": wv})["y"], xv @ wv.T, atol=EXACT_F32, what="replayed graph")
    assert g.n_nodes == n_nodes  # replay did not rebuild


def test_two_graphs_sharing_one_allocator_each_get_their_own_results(rng):
    first = Graph(name="first")
    second = Graph(name="second", allocator=first.allocator)
    for g, op in ((first, ops.silu), (second, ops.tanh)):
        x = g.input("x", (5, 6))
        g.output(op(x), "y")
    xv = rng.standard_normal((5, 6)).astype(np.float32)
    a = first.run({"x": xv})["y"]
    b = second.run({"x": xv})["y"]
    a_again = first.run({"x": xv})["y"]  # re-allocated after the other graph used the buffer
    assert_close(a_again, a, atol=0, what="graph after another used the allocator")
    assert_close(b, np.tanh(xv), atol=EXACT_F32, what="second graph")
    assert_differs(a, b, atol=1e-3, what="two different graphs")


def test_reset_and_rebuild_with_a_longer_sequence(rng):
    g = Graph(name="grow")
    for t in (3, 300, 7):
        g.reset()
        x = g.input("x", (t, 16))
        g.output(ops.sum_rows(x), "s", ndim=2)
        xv = rng.standard_normal((t, 16)).astype(np.float32)
        assert_close(g.run({"x": xv})["s"], xv.sum(axis=1, keepdims=True), atol=1e-5,
                     what=f"sum_rows at T={t}")


def test_graph_with_more_tensors_than_one_context_holds(rng):
    # 5000 ops spill over several metadata contexts and size the cgraph from the build.
    g = Graph(name="long")
    x = g.input("x", (2, 4))
    y = x
    for _ in range(5000):
        y = ops.scale(y, 1.0001)
    g.output(y, "y")
    xv = rng.standard_normal((2, 4)).astype(np.float32)
    assert_close(g.run({"x": xv})["y"], xv * 1.0001 ** 5000, atol=1e-4, rtol=1e-4, what="5000 ops")


def test_missing_input_wrong_input_shape_and_unknown_input_raise():
    g = Graph(name="errors")
    x = g.input("x", (2, 3))
    g.output(ops.silu(x), "y")
    with pytest.raises(ShapeError, match="missing input"):
        g.run({})
    with pytest.raises(ShapeError, match=r"expected shape \(2, 3\)"):
        g.run({"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(ShapeError, match="no input"):
        g.run({"x": np.zeros((2, 3), np.float32), "nope": 1})


def test_mismatched_shapes_raise_and_the_process_survives():
    g = Graph(name="bad")
    a = g.input("a", (2, 3))
    b = g.input("b", (2, 4))
    with pytest.raises(ShapeError, match="mul_mat"):
        ops.mul_mat(a, b)
    with pytest.raises(ShapeError, match="add"):
        ops.add(a, b)
    # still alive and usable
    g.output(ops.mul_mat(a, a), "ok")
    assert g.run({"a": np.ones((2, 3), np.float32), "b": np.ones((2, 4), np.float32)})["ok"].shape == (2, 2)


def test_tensor_has_no_truth_value():
    g = Graph(name="bool")
    x = g.input("x", (1,))
    with pytest.raises(TypeError):
        bool(x)


def test_integer_inputs_and_outputs_round_trip():
    g = Graph(name="ints")
    x = g.input("x", (3, 5))
    g.output(ops.argmax(x), "i")
    xv = np.array([[0, 1, 5, 2, 3], [9, 0, 0, 0, 0], [0, 0, 0, 0, 7]], np.float32)
    out = g.run({"x": xv})["i"]
    assert out.dtype == np.int32 and out.tolist() == [2, 0, 4]
    ids = Graph(name="ids").input("ids", (4,), I32)
    assert ids.type == I32


def test_unknown_backend_name_is_a_clear_error():
    with pytest.raises(BackendError, match="is not a ggml backend: this build has cpu"):
        Backend("nosuchbackend")


def test_backend_threads_and_close_are_idempotent():
    b = Backend("cpu", threads=1)
    assert b.threads == 1 and b.is_cpu
    b.set_threads(2)
    assert b.threads == 2
    b.close()
    b.close()
    with pytest.raises(BackendError, match="closed"):
        b.ptr


def test_missing_libraries_give_one_line_error_naming_the_fix(tmp_path):
    code = textwrap.dedent("""
        from moss_tts.ggml import lib
        from moss_tts.errors import BackendError
        try:
            lib.get()
        except BackendError as e:
            print("ERR", e)
    """)
    out = _run_python(code, tmp_path)
    line = out.stdout.strip()
    assert line.startswith("ERR") and "\n" not in line
    assert "manifest" in line and "pip install" in line


def test_broken_library_file_is_a_clear_error(tmp_path):
    (tmp_path / "libggml-base.so").write_bytes(b"not an elf")
    (tmp_path / "manifest.json").write_text('{"libraries": ["libggml-base.so"]}')
    code = ("from moss_tts.ggml import lib\n"
            "try:\n    lib.get()\nexcept Exception as e:\n    print(type(e).__name__, e)")
    out = _run_python(code, tmp_path)
    assert out.stdout.startswith("BackendError cannot load ggml library"), out.stdout + out.stderr


def test_a_gpu_backend_library_that_will_not_load_names_the_runtime_and_the_switch(tmp_path):
    """A CUDA build where the CUDA runtime (libcudart, libcublas) is not found: libggml-cuda.so
    does not load, and libggml.so links it, so nothing does; the line says so and how to fix it,
    not "rebuild" (which rebuilds the same CUDA build) (issue 35)."""
    (tmp_path / "libggml-cuda.so").write_bytes(b"not an elf")
    (tmp_path / "manifest.json").write_text('{"libraries": ["libggml-cuda.so"]}')
    code = ("from moss_tts.ggml import lib\n"
            "try:\n    lib.get()\nexcept Exception as e:\n    print(type(e).__name__, e)")
    line = _run_python(code, tmp_path).stdout.strip()
    assert line.startswith("BackendError cannot load ggml library") and "\n" not in line, line
    assert "cuda backend" in line and "LD_LIBRARY_PATH" in line, line
    assert "`MOSS_TTS_GGML_CUDA=0 python -m ggml_build`" in line, line


def test_out_of_range_ids_raise_before_ggml_sees_them(rng):
    # get_rows / set_rows kernels GGML_ASSERT the row index: the graph checks its inputs first
    g = Graph(name="ids")
    table = g.input("table", (5, 3))
    ids = g.input("ids", (2,), I32)
    g.output(ops.get_rows(table, ids), "rows", ndim=2)
    tv = rng.standard_normal((5, 3)).astype(np.float32)
    for bad in ([0, 5], [-1, 0]):
        with pytest.raises(InputError, match=r"outside the \[0, 5\) rows"):
            g.run({"table": tv, "ids": np.array(bad, np.int32)})
    assert_close(g.run({"table": tv, "ids": np.array([4, 0], np.int32)})["rows"], tv[[4, 0]],
                 atol=0, what="in-range ids after a rejected write")


def test_cache_slot_out_of_range_raises(rng):
    from moss_tts.nn import KVCache
    cache = KVCache(1, 1, 4, 4)
    g = Graph(name="slots")
    k = g.input("k", (1, 1, 4))
    slots = g.input("slots", (1,), I32)
    cache.store(0, k, k, slots)
    g.output(ops.cont(cache.keys(g, 0)), "keys", ndim=3)
    with pytest.raises(InputError, match=r"\[0, 4\)"):
        g.run({"k": np.ones((1, 1, 4), np.float32), "slots": np.array([4], np.int32)})


@pytest.mark.parametrize("make", [
    lambda x: x,
    lambda x: ops.permute(x, 1, 0, 2),
    lambda x: ops.permute(x, 0, 2, 1),
    lambda x: ops.view(x, (4, 3, 2), (x.nb[1], x.nb[2]), 16),
    lambda x: ops.view(x, (8, 1, 2), (x.nb[1], x.nb[2])),
    lambda x: ops.view(x, (8, 3, 1)),
    lambda x: ops.transpose(x),
], ids=["plain", "swap01", "swap12", "padded_rows", "single_row_planes", "one_plane", "transpose"])
def test_python_contiguity_matches_ggml(make):
    g = Graph(name="contig")
    t = make(g.input("x", (2, 3, 8)))
    L = lib.get()
    assert t.is_contiguous() == bool(L.ggml_is_contiguous(t.ptr))


def test_ggml_log_lines_reach_python_logging_at_debug(tmp_path, caplog):
    import logging
    from moss_tts.errors import ModelFileError
    from moss_tts.ggml import GGUFFile
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8)  # magic, version, then garbage
    with caplog.at_level(logging.DEBUG, logger="moss_tts.ggml"):
        with pytest.raises(ModelFileError, match="ggml: ") as e:
            GGUFFile(p)
    assert "\n" not in str(e.value)
    records = [r for r in caplog.records if r.name == "moss_tts.ggml"]
    assert records and all(r.levelno == logging.DEBUG for r in records)


def test_graph_replayed_after_a_larger_graph_grew_the_shared_buffer(rng):
    # The allocator keeps tensors that already have an address; when a larger graph reallocates
    # the shared buffer, an earlier graph must be placed again, not run on freed memory.
    small = Graph(name="small")
    big = Graph(name="big", allocator=small.allocator)
    xs = small.input("x", (2, 8))
    small.output(ops.tanh(ops.silu(xs)), "y")
    xb = big.input("x", (4096, 64))
    big.output(ops.silu(ops.tanh(xb)), "y")
    v = rng.standard_normal((2, 8)).astype(np.float32)
    first = small.run({"x": v})["y"]
    size_before = small.allocator.buffer_size
    big.run({"x": rng.standard_normal((4096, 64)).astype(np.float32)})
    assert small.allocator.buffer_size > size_before  # the buffer really was reallocated
    for _ in range(3):
        assert_close(small.run({"x": v})["y"], first, atol=0, what="small graph after growth")


def test_graphs_computed_from_two_threads_on_one_backend_keep_their_results():
    """The CPU backend plans every compute into one work buffer it owns (here: x converted to
    f16 for the f16 weights), so two threads computing at once must be serialized. Without the
    backend's lock this run gave hundreds of wrong results out of 400."""
    import threading

    from moss_tts.ggml import F16

    backend = Backend("cpu", threads=2)
    wrong = []

    def worker(seed):
        r = np.random.default_rng(seed)
        feed = {"w": r.standard_normal((512, 512)).astype(np.float16),
                "x": r.standard_normal((96, 512)).astype(np.float32)}
        g = Graph(backend, name=f"thread{seed}")
        g.output(ops.mul_mat(g.input("w", (512, 512), F16), g.input("x", (96, 512))), "y")
        g.build()
        want = g.run(feed)["y"]
        wrong.extend(seed for _ in range(200) if not np.array_equal(g.run(feed)["y"], want))
        g.close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    backend.close()
    assert not wrong, f"{len(wrong)} of 400 concurrent computes gave another graph's result"
