"""The guards in moss_tts/ggml/graph.py and ops.py that stand between a mistake and a process
abort: index values reaching get_rows / set_rows by any path (an input, a view of one, a copy, a
computed result), and the layouts and types ggml's copy kernels (cpy / cast / cont) and set_rows
cannot take. Would-be aborts run in child processes (tests/ggml/child.py)."""

import numpy as np
import pytest

from fixtures.compare import assert_close
from moss_tts.errors import ShapeError
from moss_tts.ggml import F32, I32, GGMLType, Graph, ops

from .child import death_detail, run_graph_child


# snippet → the package error that must replace ggml's abort. Each aborted the process before
# the guard covered its path.
CASES = {
    # ids reach get_rows through a view / reshape / copy of an input: checked on every write
    "get_rows_ids_slice_of_input": ("InputError", """
        t = g.input("t", (5, 4))
        ids = g.input("ids", (4,), I32)
        g.output(ops.get_rows(t, ops.view(ids, (2,), offset=8)), "o", ndim=2)
        g.run({"t": np.ones((5, 4), np.float32), "ids": np.array([0, 1, 7, 2], np.int32)})"""),
    "get_rows_ids_reshape_of_input": ("InputError", """
        t = g.input("t", (5, 4))
        ids = g.input("ids", (2, 3), I32)
        g.output(ops.get_rows(t, ops.reshape(ids, 6)), "o", ndim=2)
        g.run({"t": np.ones((5, 4), np.float32), "ids": np.array([[0, 1, 2], [3, 4, 5]], np.int32)})"""),
    "get_rows_ids_cont_of_transposed_input": ("InputError", """
        t = g.input("t", (3, 5, 4))
        ids = g.input("ids", (2, 3), I32)
        g.output(ops.get_rows(t, ops.cont(ops.transpose(ids))), "o", ndim=3)
        g.run({"t": np.ones((3, 5, 4), np.float32), "ids": np.array([[0, 1, 2], [3, 9, 4]], np.int32)})"""),
    "set_rows_rows_slice_of_input": ("InputError", """
        d = g.input("d", (4, 3)); s = g.input("s", (2, 3))
        rows = g.input("rows", (3,), I32)
        g.output(ops.set_rows(d, s, ops.view(rows, (2,), offset=4)), "o", ndim=2)
        g.run({"d": np.zeros((4, 3), np.float32), "s": np.ones((2, 3), np.float32),
               "rows": np.array([0, 3, 4], np.int32)})"""),
    # ids computed in the graph: refused unless bounded by construction within the table
    "get_rows_ids_cast_from_f32": ("ShapeError", """
        t = g.input("t", (5, 4))
        x = g.input("x", (3,))
        g.output(ops.get_rows(t, ops.cast(x, I32)), "o", ndim=2)
        g.run({"t": np.ones((5, 4), np.float32), "x": np.array([0, 1, 9], np.float32)})"""),
    "get_rows_argmax_over_more_entries_than_rows": ("ShapeError", """
        t = g.input("t", (5, 4))
        score = g.input("score", (2, 8))
        g.output(ops.get_rows(t, ops.argmax(score)), "o", ndim=2)
        v = np.zeros((2, 8), np.float32); v[:, 7] = 1
        g.run({"t": np.ones((5, 4), np.float32), "score": v})"""),
    # copy kernels and set_rows: layouts and types ggml asserts on or does not implement
    "set_rows_src_rows_not_contiguous": ("ShapeError", """
        d = g.input("d", (4, 3)); s = g.input("s", (3, 2))
        rows = g.input("rows", (2,), I32)
        g.output(ops.set_rows(d, ops.transpose(s), rows), "o", ndim=2)"""),
    "cast_i32_to_f16": ("ShapeError", """
        x = g.input("x", (4,), I32)
        g.output(ops.cast(ops.cast(x, F16), F32), "o")
        g.run({"x": np.arange(4, dtype=np.int32)})"""),
    "cpy_i32_into_f16": ("ShapeError", """
        x = g.input("x", (4,), I32); y = g.input("y", (4,), F16)
        g.output(ops.cast(ops.cpy(x, y), F32), "o")
        g.run({"x": np.arange(4, dtype=np.int32), "y": np.zeros(4, np.float16)})"""),
    "cast_transposed_f32_to_q8_0": ("ShapeError", """
        x = g.input("x", (32, 4))
        g.output(ops.cast(ops.cast(ops.transpose(x), GGMLType.Q8_0), F32), "o")
        g.run({"x": np.ones((32, 4), np.float32)})"""),
    # a view whose windows overlap (im2col-like): its data fits, but ggml asserts that the
    # view's packed size from its offset fits its source too
    "view_of_overlapping_windows": ("ShapeError", """
        x = g.input("x", (8,))
        g.output(ops.cont(ops.view(x, (4, 3), (4,))), "o", ndim=2)
        g.run({"x": np.arange(8, dtype=np.float32)})"""),
    "cont_of_transposed_q8_0": ("ShapeError", """
        x = g.input("x", (64, 64))
        q = ops.cast(x, GGMLType.Q8_0)
        g.output(ops.cast(ops.cont(ops.transpose(q)), F32), "o")
        g.run({"x": np.ones((64, 64), np.float32)})"""),
}


@pytest.mark.parametrize("name", list(CASES))
def test_index_and_copy_mistakes_raise_instead_of_aborting(name):
    error, snippet = CASES[name]
    proc = run_graph_child(snippet)
    assert proc.returncode == 0, f"{name}: child died ({proc.returncode}): {death_detail(proc)}"
    assert proc.stdout.startswith(error), f"{name}: expected {error}, got {proc.stdout!r}"


def test_only_the_viewed_window_of_an_index_input_is_checked(rng):
    # values outside the window get_rows reads may be anything (e.g. ids of another table);
    # an out-of-range value inside it is get_rows_ids_slice_of_input above
    table = rng.standard_normal((5, 4)).astype(np.float32)
    with Graph(name="window") as g:
        t = g.input("t", (5, 4))
        ids = g.input("ids", (4,), I32)
        g.output(ops.get_rows(t, ops.view(ids, (2,), offset=4)), "o", ndim=2)
        got = g.run({"t": table, "ids": np.array([99, 4, 0, -7], np.int32)})["o"]
    assert_close(got, table[[4, 0]], atol=0, what="rows picked through the window")


def test_argmax_ids_within_the_table_are_accepted_and_gather_the_right_rows(rng):
    table = rng.standard_normal((5, 3)).astype(np.float32)
    score = rng.standard_normal((4, 5)).astype(np.float32)
    with Graph(name="argmax_ids") as g:
        t = g.input("t", (5, 3))
        s = g.input("s", (4, 5))
        g.output(ops.get_rows(t, ops.argmax(s)), "o", ndim=2)
        got = g.run({"t": table, "s": score})["o"]
    assert_close(got, table[score.argmax(-1)], atol=0, what="rows of the argmax ids")


def test_supported_casts_still_build_and_convert(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    with Graph(name="casts") as g:
        xi = g.input("x", (4, 64))
        q = ops.cast(xi, GGMLType.Q8_0)
        g.output(ops.cast(q, F32), "q8", ndim=2)
        g.output(ops.cast(ops.cast(ops.transpose(xi), GGMLType.F16), F32), "f16t", ndim=2)
        got = g.run({"x": x})
    assert_close(got["q8"], x, atol=0.02, what="f32 → q8_0 → f32")  # q8_0: 1/127 of a block max
    assert_close(got["f16t"], x.T, atol=4e-3, what="transposed f32 → f16 → f32")


def test_ids_from_a_persistent_tensor_are_refused(rng):
    from moss_tts.ggml.weights import TensorStore
    with TensorStore({"ids": np.array([0, 1], np.int32), "t": np.ones((5, 4), np.float32)}) as s, \
            Graph(name="persistent_ids") as g:
        with pytest.raises(ShapeError, match="cannot be range-checked"):
            ops.get_rows(ops.view(s["t"], (4, 5), graph=g), s["ids"])
