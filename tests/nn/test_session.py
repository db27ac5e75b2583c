"""DecodeSession (moss_tts/nn/session.py): prefill + replayed one-row steps over a KV cache equal
a full recompute by the numpy reference, and a step attends over its bucket of the filled
prefix, not the whole capacity."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from moss_tts.errors import ContextFull, InputError
from moss_tts.ggml import TensorStore, get_backend
from moss_tts.models import gpt2
from moss_tts.nn.session import (SLOT_ALIGN, DecodeSession, SessionsOwner, SharedDecodeSession,
                                 bucket, concat_rows)
from tests.models.test_gpt2 import CFG, random_tensors
from tests.models.test_gpt2 import reference as gpt2_reference

CAPACITY = 200          # rounded up to 224 slots: buckets 32, 64, 128, 224
PROMPT = 10
# f32 through two blocks against float64 (|x| ≲ 5, ≤ 96-term dots): measured ≤ 3e-6
F32_ATOL = 5e-5


@pytest.fixture(scope="module")
def weights():
    arrays = random_tensors(11)
    store = TensorStore(arrays, get_backend(None, 1))
    yield store, arrays
    store.close()


def reference(arrays, x):
    return gpt2_reference(arrays, x, np.arange(len(x)))


def make_session(store, cls=DecodeSession, capacity=CAPACITY):
    layers = [gpt2.GPT2Layer.from_tensors(store, f"h.{i}.", CFG) for i in range(CFG.n_layer)]

    def build(g, n_rows, kv, variant):
        x = g.input("x", (n_rows, CFG.n_embd))
        h = gpt2.forward(x, layers, (store["ln_f.weight"], store["ln_f.bias"]), CFG, kv=kv)
        g.output(h, "hidden", ndim=2)

    return cls(build, backend=get_backend(None, 1), n_layer=CFG.n_layer,
                         n_kv_head=CFG.n_head, head_dim=CFG.head_dim, capacity=capacity,
                         prefix="kv", name="test.session")


def test_bucket_rounds_the_filled_prefix_up_to_a_power_of_two_within_capacity():
    assert [bucket(n, 224) for n in (1, 11, 32, 33, 64, 65, 129, 224)] == \
        [32, 32, 32, 64, 64, 128, 224, 224]
    assert bucket(3, 17) == 17


def test_cached_steps_match_full_recompute_and_use_small_buckets(weights):
    store, arrays = weights
    n = 70
    x = np.random.default_rng(3).standard_normal((n, CFG.n_embd)).astype(np.float32)
    want = reference(arrays, x)
    with make_session(store) as s:
        assert s.capacity == 224 and s.capacity % SLOT_ALIGN == 0
        s.reserve(PROMPT)
        got = [s.run({"x": x[:PROMPT]}, PROMPT)["hidden"]]
        graphs = {}
        for k in range(PROMPT, n):
            got.append(s.run({"x": x[k:k + 1]}, 1)["hidden"])
            graphs.setdefault(k, list(s.step_graphs.values())[-1])
        assert_close(np.concatenate(got), want, atol=F32_ATOL, what="prefill + steps")
        # the step at position 10 attends over 32 slots (its mask and the K views), not 224
        assert graphs[PROMPT].inputs["kv.mask"].ne[:2] == (32, 1)
        assert graphs[40].inputs["kv.mask"].ne[:2] == (64, 1)
        assert graphs[69].inputs["kv.mask"].ne[:2] == (128, 1)
        # one graph per bucket, replayed for every other step in it
        assert sorted(s.step_graphs) == [(None, 32), (None, 64), (None, 128)]
        assert graphs[PROMPT] is graphs[31] and graphs[32] is graphs[63]


def test_step_at_the_wrong_position_or_prefix_is_detected(weights):
    store, arrays = weights
    x = np.random.default_rng(4).standard_normal((PROMPT + 1, CFG.n_embd)).astype(np.float32)
    want = reference(arrays, x)[-1:]
    with make_session(store) as s:
        s.run({"x": x[:PROMPT]}, PROMPT)
        s.position += 1
        shifted = s.run({"x": x[PROMPT:]}, 1)["hidden"]
        s.reset()
        other = x.copy()
        other[2] = other[5]            # one cached row replaced by another
        s.run({"x": other[:PROMPT]}, PROMPT)
        wrong_prefix = s.run({"x": x[PROMPT:]}, 1)["hidden"]
        s.reset()
        s.run({"x": x[:PROMPT]}, PROMPT)
        assert_close(s.run({"x": x[PROMPT:]}, 1)["hidden"], want, atol=F32_ATOL,
                     what="after reset")
    assert_differs(shifted, want, atol=F32_ATOL, what="step one position late")
    assert_differs(wrong_prefix, want, atol=F32_ATOL, what="one cached row changed")


def test_rows_past_the_capacity_raise_input_error(weights):
    store, _ = weights
    with make_session(store) as s:
        s.run({"x": np.zeros((220, CFG.n_embd), np.float32) + 0.1}, 220)
        with pytest.raises(InputError, match="capacity of 224"):
            s.run({"x": np.zeros((5, CFG.n_embd), np.float32)}, 5)


def test_reserve_sizes_the_prefill_allocator_for_the_worst_case_up_front(weights):
    """reserve(n) allocates for n rows over the whole cache; prefills up to n rows then
    never grow the buffer."""
    store, _ = weights
    x = np.random.default_rng(5).standard_normal((40, CFG.n_embd)).astype(np.float32)
    with make_session(store) as s:
        size = s.reserve(40)
        assert size > 0 and s.prefill_allocator.buffer_size == size
        s.run({"x": x[:25]}, 25)
        s.run({"x": x[25:]}, 15)
        assert s.prefill_allocator.buffer_size == size


def test_a_sessions_owner_closes_what_a_half_built_state_holds():
    closed = []

    class Fake:                                  # idempotent, as DecodeSession.close is
        def __init__(self, name):
            self.name, self.open = name, True

        def close(self):
            if self.open:
                closed.append(self.name)
                self.open = False

    class State(SessionsOwner):
        SESSIONS = ("backbone", "depth")

        def __init__(self, build_depth):
            self.backbone = Fake("backbone")
            if build_depth:
                self.depth = Fake("depth")

    whole = State(True)
    whole.close()
    assert closed == ["backbone", "depth"]
    closed.clear()
    half = State(False)                          # as if the depth session failed to allocate
    half.close()
    assert closed == ["backbone"]


# --- several sequences in one session ------------------------------------------------------------
# A sequence decoded among others equals the sequence decoded alone bit for bit: its rows sit in
# a region laid out as its own cache (slot = position), each row attends over that region only
# (the same windows, so the same flash-attention path and tiles), and a step's matmuls run each
# row through the same kernel whatever the row count (Graph.rowwise). Before issue 31 a step of B rows took
# ggml's B-column GEMM (~1.5e-6 away) and attended over the shared span: this test allowed 1e-5
# and missed what an f16 cache and a sampled draw made of it.
SHARED_ATOL = 0.0


def alone(store, x, chunk=PROMPT):
    """Every row's hidden of sequence x (T, D) run alone in a session of CAPACITY rows: a prompt
    of PROMPT rows (appended `chunk` rows at a time), then steps."""
    with make_session(store) as s:
        out = [concat_rows(s.prefill({"x": x[:PROMPT]}, PROMPT, max_rows=chunk))["hidden"]]
        out += [s.run({"x": x[k:k + 1]}, 1)["hidden"] for k in range(PROMPT, len(x))]
    return np.concatenate(out)


def test_sequences_sharing_a_session_equal_each_sequence_alone(weights):
    """A and B start together; A leaves after 4 steps, C joins into A's freed region (its prompt
    in chunks); every step carries one row per open sequence (in varying order). Each sequence's
    rows equal the same sequence run alone (its prompt in the same chunks), bit for bit, and the
    reference; a step graph is built per set of windows and replayed."""
    store, arrays = weights
    rng = np.random.default_rng(21)
    xs = {name: rng.standard_normal((PROMPT + n, CFG.n_embd)).astype(np.float32)
          for name, n in (("a", 4), ("b", 40), ("c", 7))}
    chunks = {"a": PROMPT, "b": PROMPT, "c": 4}
    got = {name: [] for name in xs}
    with make_session(store, SharedDecodeSession, capacity=2 * CAPACITY + 20) as s:
        seq, done = {}, {}

        def join(name):
            seq[name], done[name] = s.open(CAPACITY), PROMPT
            outs = s.prefill_sequence(seq[name], {"x": xs[name][:PROMPT]}, PROMPT,
                                      max_rows=chunks[name])
            got[name].append(concat_rows(outs)["hidden"])

        def step(names):
            rows = np.stack([xs[n][done[n]] for n in names])
            out = s.step([seq[n] for n in names], {"x": rows})["hidden"]
            for i, n in enumerate(names):
                got[n].append(out[i:i + 1])
                done[n] += 1

        join("a")
        join("b")
        assert [s.cache.region(seq[n]) for n in "ab"] == [(0, 224), (224, 224)]
        for _ in range(4):
            step(["a", "b"])
        s.release(seq["a"])
        join("c")                                # its prompt in chunks of 4, 4, 2 rows
        assert s.cache.region(seq["c"]) == (0, 224)     # a's freed region
        for k in range(7):
            step(["c", "b"] if k % 2 else ["b", "c"])
        for _ in range(PROMPT + 40 - done["b"]):
            step(["b"])
        windows = [key[1] for key in s.step_graphs]
        assert all(len(w) in (1, 2) for w in windows) and len(windows) <= 6
        assert ((224, 64, 1),) in windows        # b alone past position 32: its 64-slot bucket
    for name, x in xs.items():
        rows = np.concatenate(got[name])
        assert_close(rows, alone(store, x, chunks[name]), atol=SHARED_ATOL,
                     what=f"{name} shared vs alone")
        assert_close(rows, reference(arrays, x), atol=F32_ATOL, what=f"{name} vs reference")


def test_a_row_given_to_the_wrong_sequence_is_detected(weights):
    """Guard: the same rows stepped under swapped sequence ids change both results."""
    store, _ = weights
    rng = np.random.default_rng(22)
    xa, xb = (rng.standard_normal((PROMPT + 1, CFG.n_embd)).astype(np.float32) for _ in "ab")
    with make_session(store, SharedDecodeSession, capacity=2 * CAPACITY + 20) as s:
        a, b = s.open(CAPACITY), s.open(CAPACITY)
        s.append(a, {"x": xa[:PROMPT]}, PROMPT)
        s.append(b, {"x": xb[:PROMPT]}, PROMPT)
        swapped = s.step([b, a], {"x": np.stack([xa[PROMPT], xb[PROMPT]])})["hidden"]
    assert_differs(swapped[0], alone(store, xa)[-1], atol=1e-5, what="row of a under b")
    assert_differs(swapped[1], alone(store, xb)[-1], atol=1e-5, what="row of b under a")


def test_shared_session_refuses_unknown_repeated_and_overflowing_sequences(weights):
    store, _ = weights
    x = np.zeros((200, CFG.n_embd), np.float32) + 0.1
    with make_session(store, SharedDecodeSession) as s:
        a = s.open(190)                          # a region of 192 of the 224 slots
        with pytest.raises(InputError, match="not open"):
            s.step([a + 1], {"x": x[:1]})
        with pytest.raises(InputError, match="at most once"):
            s.step([a, a], {"x": x[:2]})
        with pytest.raises(InputError, match="append"):
            s.run({"x": x[:1]}, 1)
        with pytest.raises(ContextFull, match="exceed its 192 slots"):
            s.append(a, {"x": x}, 200)
        s.append(a, {"x": x[:190]}, 190)
        assert s.fits(32) and not s.fits(33)
        with pytest.raises(ContextFull, match="no free run of 64 slots"):
            s.open(40)
        s.release(a)
        b = s.open(40)
        s.append(b, {"x": x[:30]}, 30)            # the freed region takes the new sequence
        assert s.cache.n_filled == 30 and s.cache.region(b) == (0, 64)
