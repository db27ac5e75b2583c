"""LocalV15Model (models/local_v15.py) on the tiny upstream-named checkpoint, converted with
--strict and loaded by the real loader, against the float64 reference
fixtures/reference/local_v15.py: the backbone hidden states, the local block per position
(cached per frame vs recomputed), greedy generation frame for frame, and bad input."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_local_v15 import AUDIO_VOCAB, N_VQ
from fixtures.reference import local_v15 as ref
from moss_tts.errors import InputError
from moss_tts.models.local_v15 import FrameChooser
from moss_tts.sampling import LocalV15SamplingOptions

# f32 ggml vs float64 through 2 Qwen3 blocks (bf16-valued weights are exact in f32) and the
# final norm: |h| ≲ 4, ≤ 48-term dots. Logits add the local block and one 32-term dot.
HIDDEN_ATOL = 2e-5
LOGIT_ATOL = 2e-4
PAD = AUDIO_VOCAB
IM_START, IM_END, START, END, USER, SLOT = 151644, 151645, 151669, 151670, 151654, 151656
GREEDY = LocalV15SamplingOptions(do_sample=False)


def prompt_rows(seed=3, reference=True):
    """A voice-clone-shaped prompt: text rows, a reference block ([START], user-slot rows with
    5 frames of codes, [END]), text, then the [START] row generation follows."""
    rng = np.random.default_rng(seed)
    text = lambda ids: np.column_stack([ids, np.full((len(ids), N_VQ), PAD)])  # noqa: E731
    block = np.vstack([text([START]),
                       np.column_stack([np.full(5, USER), rng.integers(0, AUDIO_VOCAB, (5, N_VQ))]),
                       text([END])])
    parts = [text([IM_START, 267, 198] + list(rng.integers(300, 400, 4))), block,
             text([IM_END, 198, IM_START, 201, 198, START])]
    return np.vstack(parts if reference else parts[::2]).astype(np.int64)


def test_forward_matches_reference(local_v15_model, local_v15_files):
    _, state, cfg, _ = local_v15_files()
    rows = prompt_rows()
    got = local_v15_model().forward(rows)
    assert_close(got, ref.hidden(state, cfg, rows), atol=HIDDEN_ATOL, what="hidden")
    # guard: a pad code contributes zero (P12) — looking pads up as code 0 instead moves it
    as_zero = np.where(rows == PAD, 0, rows)
    as_zero[:, 0] = rows[:, 0]
    assert_differs(got, ref.hidden(state, cfg, as_zero), atol=HIDDEN_ATOL, what="pad as code 0")


def test_depth_logits_match_reference_recompute(local_v15_model, local_v15_files):
    """The per-frame local cache (one replayed graph per position) == upstream's recompute of
    the whole local sequence at every position; interleaved RoPE, not NEOX (P10)."""
    _, state, cfg, _ = local_v15_files()
    model = local_v15_model()
    h = model.forward(prompt_rows())[-1]
    codes = np.random.default_rng(7).integers(0, AUDIO_VOCAB, N_VQ)
    decision, audio = model.depth_logits(h, codes)
    want_decision, want_audio = ref.depth_logits(state, cfg, h, codes)
    assert audio.shape == (N_VQ, AUDIO_VOCAB)
    assert_close(decision, want_decision, atol=LOGIT_ATOL, what="continue/stop logits")
    assert_close(audio, want_audio, atol=LOGIT_ATOL, what="audio logits")
    # guards: NEOX rotation, and one changed earlier code, each move the later positions
    _, neox = ref.depth_logits(state, cfg, h, codes, rope_mode="neox")
    assert_differs(audio[1:], neox[1:], atol=LOGIT_ATOL, what="NEOX local RoPE")
    other = codes.copy()
    other[0] = (other[0] + 1) % AUDIO_VOCAB
    assert_differs(audio[1:], model.depth_logits(h, other)[1][1:], atol=LOGIT_ATOL,
                   what="a changed code 0")
    # a shorter teacher-forced prefix gives the same leading channels
    _, first = model.depth_logits(h, codes[:1])
    assert_close(first, audio[:2], atol=1e-6, what="prefix of the frame")


@pytest.mark.parametrize("bias, penalty", [(1.0, 1.0), (6.0, 1.0), (6.0, 2.0)],
                         ids=["stops_mid_way", "long_audio", "long_audio_penalty"])
def test_greedy_generation_matches_reference_frame_for_frame(local_v15_model, local_v15_files,
                                                              bias, penalty):
    """KV-cached backbone steps + the per-frame local cache == the reference recomputing
    everything at every frame and every position; the stop adds no frame."""
    _, state, cfg, _ = local_v15_files(bias)
    model = local_v15_model(bias)
    rows = prompt_rows()
    opts = LocalV15SamplingOptions(do_sample=False, audio_repetition_penalty=penalty)
    got = model.generate(rows, options=opts, max_frames=6)
    want = ref.generate_greedy(state, cfg, rows, 6, repetition_penalty=penalty)
    np.testing.assert_array_equal(got, want)
    if bias < 6:
        assert 0 < len(got) < 6, "the 2-way head should stop this prompt after a few frames"
    else:
        assert len(got) == 6 and (got[:, 0] == SLOT).all()
        other = model.generate(prompt_rows(seed=4), options=opts, max_frames=6)
        assert not np.array_equal(other, got), "another prompt generated the same frames"


def test_stop_head_ends_without_a_frame(local_v15_model):
    assert local_v15_model(-6.0).generate(prompt_rows(), options=GREEDY, max_frames=5).shape \
        == (0, N_VQ + 1)


def test_repetition_penalty_reads_generated_frames_only(local_v15_model, local_v15_files):
    """The prompt's reference codes are not history (§family-4.6): the first frame is the same with
    and without a penalty; later frames move."""
    model = local_v15_model(6.0)
    rows = prompt_rows()
    plain = model.generate(rows, options=GREEDY, max_frames=6)
    penalized = model.generate(rows, max_frames=6, options=LocalV15SamplingOptions(
        do_sample=False, audio_repetition_penalty=4.0))
    np.testing.assert_array_equal(plain[0], penalized[0])
    assert not np.array_equal(plain, penalized)


def test_sampled_generation_is_reproducible_for_a_seed(local_v15_model):
    model, rows = local_v15_model(6.0), prompt_rows()
    a = model.generate(rows, seed=5, max_frames=5)
    b = model.generate(rows, seed=5, max_frames=5)
    c = model.generate(rows, seed=6, max_frames=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("rows, match", [
    (np.zeros((3, N_VQ), dtype=int), "shape"),
    (np.zeros((0, N_VQ + 1), dtype=int), "shape"),
    (np.full((2, N_VQ + 1), 1.5), "integers"),
    (np.array([[1] + [AUDIO_VOCAB + 1] * N_VQ]), "audio codes"),
    (np.array([[-1] + [PAD] * N_VQ]), "text ids"),
])
def test_bad_rows_are_one_line_input_errors(local_v15_model, rows, match):
    with pytest.raises(InputError, match=match) as e:
        local_v15_model().forward(rows)
    assert "\n" not in str(e.value)


def test_bad_generation_arguments_are_input_errors(local_v15_model):
    model = local_v15_model()
    with pytest.raises(InputError, match="max_frames"):
        model.generate(prompt_rows(), max_frames=0)
    with pytest.raises(InputError, match="LocalV15SamplingOptions"):
        model.generate(prompt_rows(), options={"do_sample": False})
    with pytest.raises(InputError, match="hidden_row"):
        model.depth_logits(np.zeros(5))
    with pytest.raises(InputError, match="codes"):
        model.depth_logits(np.zeros(32), [AUDIO_VOCAB])


def test_local_block_at_the_real_head_dim_matches_reference(tmp_path):
    """The real local geometry: head_dim 80 (2560 / 32; here 160 / 2), silu MLP, interleaved
    RoPE with base 1e6, fed one position at a time through one replayed step graph over 12
    positions == the reference recomputing the prefix at each position (P10)."""
    from converters.gguf_io import write_gguf
    from fixtures.reference import ops as ref_ops
    from fixtures.reference.transformer import GPT2_KEYS, gpt2_block
    from moss_tts.ggml import Graph, Weights
    from moss_tts.models import gpt2
    from moss_tts.nn import KVCache

    cfg = gpt2.GPT2Config(n_embd=160, n_head=2, n_layer=1, n_inner=96, layer_norm_epsilon=1e-6,
                          rope_base=1e6, activation_function="silu")
    rng = np.random.default_rng(11)
    tensors = {f"h.0.{n}": ((n.startswith("ln_") and n.endswith("weight")) +
                            0.3 * rng.standard_normal(s)).astype(np.float32)
               for n, s in cfg.layer_shapes().items()}
    tensors |= {"ln_f.weight": (1 + 0.1 * rng.standard_normal(160)).astype(np.float32),
                "ln_f.bias": (0.1 * rng.standard_normal(160)).astype(np.float32)}
    path = write_gguf(tmp_path / "local.gguf", tensors, {"t.n_embd": 160}, kind="test", version=1)
    x = rng.standard_normal((N_VQ * 3, 160)).astype(np.float32)

    def reference(rows, mode="normal", activation="silu"):
        w = {k: tensors[f"h.0.{k}"] for k in GPT2_KEYS}
        y = gpt2_block(rows, np.arange(len(rows)), w, n_head=2, rope_mode=mode, rope_base=1e6,
                       eps=1e-6, activation=activation)
        return ref_ops.layer_norm(y, tensors["ln_f.weight"], tensors["ln_f.bias"], eps=1e-6)

    with Weights.load(path) as w, KVCache(1, 2, 80, len(x)) as cache:
        step = gpt2.build_cached_graph(Graph(name="local"), w, cfg, cache, 1, len(x))
        for p in range(len(x)):
            got = step.run(gpt2.cached_feed(cache, x[p:p + 1], [p], len(x)))["hidden"]
            assert_close(got, reference(x[:p + 1])[-1:], atol=5e-5, what=f"position {p}")
    assert_differs(got, reference(x, mode="neox")[-1:], atol=5e-5, what="NEOX rotation")
    assert_differs(got, reference(x, activation="gelu_tanh")[-1:], atol=5e-5, what="gelu MLP")


def test_each_local_position_graph_is_built_once_and_replayed(local_v15_model):
    """Design §3: the local block's n_vq position graphs are built on the first frame and
    replayed by every later one (the per-frame cache is reset, not rebuilt); the backbone's
    one-row step graph too."""
    model = local_v15_model(6.0)
    chooser = FrameChooser(model.config, GREEDY, 0, 64)
    with model.make_state(64) as state:
        h = model.prefill(state, prompt_rows())
        codes = model.frame(state, h, chooser)
        graphs = dict(state.depth.step_graphs)
        assert sorted(p for p, _ in graphs) == list(range(N_VQ))
        for _ in range(3):
            h = model.prefill(state, model.frame_row(codes))
            steps = dict(state.backbone.step_graphs)
            codes = model.frame(state, h, chooser)
            assert state.depth.step_graphs == graphs
        assert state.backbone.step_graphs == steps and len(steps) == 1


def test_a_gguf_of_another_kind_is_a_one_line_model_file_error(delay_files):
    from moss_tts.errors import ModelFileError
    from moss_tts.ggml import Weights
    from moss_tts.models.local_v15 import LocalV15Model

    with pytest.raises(ModelFileError, match="local-v15") as e:
        LocalV15Model(Weights.load(delay_files()[3]))
    assert "\n" not in str(e.value)
