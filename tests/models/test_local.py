"""LocalModel (models/local.py) on the tiny upstream-named checkpoint, converted with --strict
and loaded by the real loader, against the float64 reference fixtures/reference/local.py: the
backbone's hidden states, the RoPE-free causal depth stack with its adapters and per-channel
heads, greedy generation frame for frame (cached backbone and depth steps vs the reference's
full recompute), n_vq_for_inference, and bad input."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_local import AUDIO_VOCAB, END, GEN, N_VQ
from fixtures.reference import local as ref
from moss_tts.errors import ConfigError, InputError, ModelFileError
from moss_tts.ggml import Weights, get_backend
from moss_tts.models.local import LocalConfig, LocalModel
from moss_tts.models.qwen3 import Qwen3Config
from moss_tts.sampling import LocalSamplingOptions

# f32 ggml vs float64 through 2 Qwen3 blocks (bf16-valued weights are exact in f32) and the
# final norm: measured ≤ 1e-6 on |h| ≲ 4. The depth logits add the adapters, 2 more blocks,
# an RMSNorm and a 32-term head dot: measured ≤ 3e-6.
HIDDEN_ATOL = 2e-5
LOGIT_ATOL = 1e-4
PAD = AUDIO_VOCAB
IM_START, START, USER = 151644, 151652, 151654
GREEDY = LocalSamplingOptions().greedy()


def prompt_rows(seed=3, reference=True):
    """A voice-clone-shaped prompt without delay (§family-3.5): text, AUDIO_START, 5 user slots
    carrying 5 frames row for row, AUDIO_END, text, then the AUDIO_START row."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, AUDIO_VOCAB, size=(5, N_VQ))
    block = np.full((len(codes) + 2, N_VQ + 1), PAD)
    block[:, 0] = [START] + [USER] * len(codes) + [END]
    block[1:-1, 1:] = codes
    text = lambda ids: np.column_stack([ids, np.full((len(ids), N_VQ), PAD)])  # noqa: E731
    parts = [text([IM_START, 267, 198] + list(rng.integers(300, 400, 4))), block,
             text([151645, 198, IM_START, 201, 198, START])]
    return np.vstack(parts if reference else parts[::2]).astype(np.int64)


def test_forward_matches_reference(local_model, local_files):
    _, state, cfg, _ = local_files()
    rows = prompt_rows()
    hidden = local_model().forward(rows)
    assert_close(hidden, ref.hidden(state, cfg, rows), atol=HIDDEN_ATOL, what="hidden")
    # n_vq_for_inference embeds only the first n audio channels (§family-3.3)
    two = local_model().forward(rows, n_vq_for_inference=2)
    assert_close(two, ref.hidden(state, cfg, rows, 2), atol=HIDDEN_ATOL, what="hidden, n = 2")
    assert_differs(two, hidden, atol=HIDDEN_ATOL, what="n = 2 vs all channels")


def test_depth_logits_match_reference(local_model, local_files):
    """Every position of a frame with the row teacher-forced: the text head at 0, audio heads
    after, pad −inf; a position's input is the previous channel's token through that
    channel's table (the text token through the text table)."""
    _, state, cfg, _ = local_files()
    model = local_model()
    g = model.forward(prompt_rows())[-1]
    row = [GEN, 3, 5, 7, 11]
    text, audio = model.depth_logits(g, row)
    want = ref.depth_logits(state, cfg, g, row[:-1])
    assert text.shape == (cfg["language_config"]["vocab_size"],)
    assert audio.shape == (N_VQ, PAD + 1)
    assert np.isneginf(audio[:, PAD]).all()
    assert_close(text, want[0], atol=LOGIT_ATOL, what="text logits")
    assert_close(audio[:, :PAD], np.array(want[1:])[:, :PAD], atol=LOGIT_ATOL,
                 what="audio logits")
    # guard: another text token at position 0 changes what follows
    other = model.depth_logits(g, [GEN + 1, 3])[1]
    assert_differs(other[0, :PAD], audio[0, :PAD], atol=LOGIT_ATOL, what="another text token")


def test_depth_stack_has_no_positional_encoding(local_files, local_model, monkeypatch):
    """The reference with NEOX RoPE in the depth stack (as the backbone) gives other logits:
    the RoPE-free stack is what the model computes (P7)."""
    from fixtures.reference import transformer

    _, state, cfg, _ = local_files()
    model = local_model()
    g = model.forward(prompt_rows())[-1]
    _, audio = model.depth_logits(g, [GEN, 3, 5])
    monkeypatch.setattr(ref, "qwen3_block", lambda *a, rope_mode, **kw: transformer.qwen3_block(
        *a, rope_mode="neox", **kw))
    roped = ref.depth_logits(state, cfg, g, [GEN, 3])
    assert_differs(audio[1, :PAD], roped[2][:PAD], atol=LOGIT_ATOL, what="RoPE in the depth")


def test_depth_cache_is_reset_every_frame(local_model):
    """The per-frame depth cache == recompute: a frame computed after another one in the
    same state equals the same frame in a fresh state."""
    model = local_model()
    g = model.forward(prompt_rows())
    with model.make_state(4) as state:
        model.frame(state, g[-2], N_VQ, lambda c, logits: 5)
        second = [model.depth_step(state, 0, g[-1])] + \
            [model.depth_step(state, p, 5 if p > 1 else GEN) for p in range(1, N_VQ + 1)]
    text, audio = model.depth_logits(g[-1], [GEN] + [5] * N_VQ)
    np.testing.assert_array_equal(second[0], text)
    np.testing.assert_array_equal(np.array(second[1:])[:, :PAD], audio[:, :PAD])


@pytest.mark.parametrize("seed, prompt, penalty, n_vq", [
    (1, 7, 1.1, None), (1, 7, 1.0, None), (1, 7, 3.0, None), (1, 7, 1.1, 2), (1, 2, 1.1, None),
    (4, 3, 1.1, None)],
    ids=["default", "no_penalty", "strong_penalty", "n_vq_2", "budget", "seed_4"])
def test_greedy_generation_matches_reference_frame_for_frame(local_model, local_files, seed,
                                                             prompt, penalty, n_vq):
    """Cached generation (prefill + replayed backbone and depth steps) == the reference
    recomputing everything every frame: GEN frames, then the audio_end row keeping its own
    sampled codes (the trailing frame, P9) — or, for "budget", max_new_frames GEN rows.
    Greedy runs no repetition penalty, whatever the options say (upstream's `_sample` has no
    processor on a do_sample=False channel, issue 22 #7): the reference runs none either."""
    _, state, cfg, _ = local_files(seed, speech=True)
    model = local_model(seed, speech=True)
    rows = prompt_rows(prompt)
    opts = LocalSamplingOptions(audio_repetition_penalty=penalty).greedy()
    got = model.generate(rows, options=opts, max_new_frames=10, n_vq_for_inference=n_vq)
    want = ref.generate_greedy(state, cfg, rows, 10, repetition_penalty=1.0, n_vq=n_vq)
    np.testing.assert_array_equal(got, want)
    if prompt == 2 or n_vq is not None:      # these two run to the budget
        assert got[:, 0].tolist() == [GEN] * 10
    else:
        assert len(got) >= 4 and got[:, 0].tolist() == [GEN] * (len(got) - 1) + [END]
        assert (got[-1, 1:1 + (n_vq or N_VQ)] != 0).any()
    if n_vq is not None:
        assert (got[:, 1 + n_vq:] == 0).all()      # channels past n are 0, as upstream (P9)
    # guard: another prompt generates other rows
    other = model.generate(prompt_rows(4), options=opts, max_new_frames=10,
                           n_vq_for_inference=n_vq)
    assert not np.array_equal(other, got)


def test_repetition_penalty_changes_sampled_codes_only(local_model):
    """The penalty reaches a sampled audio channel (the same seed draws other codes under a
    strong one) and no greedy channel (issue 22 #7)."""
    rows = prompt_rows(7)
    model = local_model(1, speech=True)
    plain, strong = LocalSamplingOptions(audio_repetition_penalty=1.0), \
        LocalSamplingOptions(audio_repetition_penalty=3.0)
    assert not np.array_equal(model.generate(rows, options=plain, seed=2, max_new_frames=8),
                              model.generate(rows, options=strong, seed=2, max_new_frames=8))
    np.testing.assert_array_equal(model.generate(rows, options=plain.greedy(), max_new_frames=8),
                                  model.generate(rows, options=strong.greedy(), max_new_frames=8))


def test_sampled_generation_is_reproducible_for_a_seed(local_model):
    rows, model = prompt_rows(7), local_model(1, speech=True)
    a = model.generate(rows, seed=5, max_new_frames=6)
    b = model.generate(rows, seed=5, max_new_frames=6)
    c = model.generate(rows, seed=6, max_new_frames=6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert (a[:, 1:] != PAD).all()              # the heads never emit the pad code (P6)


@pytest.mark.parametrize("bad, match", [
    (np.zeros((3, N_VQ), dtype=np.int64), "shape"),
    (np.full((2, N_VQ + 1), PAD + 1), "audio codes"),
    (np.array([[151680] + [PAD] * N_VQ]), "text ids"),
    (np.zeros((2, N_VQ + 1), dtype=np.float32), "integers"),
])
def test_bad_rows_raise_input_error(local_model, bad, match):
    with pytest.raises(InputError, match=match):
        local_model().forward(bad)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_new_frames": 0}, "max_new_frames must be at least 1"),
    ({"n_vq_for_inference": 0}, "n_vq_for_inference must be a whole number in 1..4"),
    ({"n_vq_for_inference": N_VQ + 1}, "n_vq_for_inference"),
])
def test_bad_generation_arguments(local_model, kwargs, match):
    with pytest.raises(InputError, match=match):
        local_model().generate(prompt_rows(), **kwargs)


def test_depth_positions_run_in_order(local_model):
    model = local_model()
    with model.make_state(1) as state:
        with pytest.raises(InputError, match="depth position 2 follows position -1"):
            model.depth_step(state, 2, 3)
        with pytest.raises(InputError, match="outside 0..4"):
            model.depth_step(state, N_VQ + 1, 3)


def test_depth_logits_rejects_a_bad_row(local_model):
    g = np.zeros(32, np.float32)
    with pytest.raises(InputError, match="row must hold 1..5 integer tokens"):
        local_model().depth_logits(g, [GEN] * (N_VQ + 2))
    with pytest.raises(InputError, match="audio codes"):
        local_model().depth_logits(g, [GEN, PAD + 1])


def test_delay_and_nano_ggufs_given_as_local_raise_model_file_error(delay_files, nano_files):
    for gguf, kind in ((delay_files()[3], "delay"), (nano_files()[1], "nano")):
        with pytest.raises(ModelFileError, match=f"expected a local GGUF, found a '{kind}'"):
            LocalModel(Weights.load(gguf, get_backend(None, 1)))


def test_config_rejects_pad_code_outside_tables_and_ids_outside_vocab():
    lc = Qwen3Config(16, 1, 2, 1, 8, 16, 1e6)
    with pytest.raises(ConfigError, match="audio_pad_code 17 is outside the 17 rows"):
        LocalConfig(lc, vocab_size=151680, audio_vocab_size=16, audio_pad_code=17)
    with pytest.raises(ConfigError, match="special id 151656 lies outside the text vocabulary"):
        LocalConfig(lc, vocab_size=151643 + 10, audio_vocab_size=16, audio_pad_code=16)
    # the depth stack copies the backbone's attention geometry, not its width (P7)
    loc = LocalConfig(lc, vocab_size=151680, local_hidden_size=12).local_config
    assert (loc.hidden_size, loc.num_attention_heads, loc.head_dim) == (12, 2, 8)


def test_generation_state_is_a_context_manager_that_frees_both_caches(local_model):
    with local_model().make_state(4) as state:
        assert state.backbone.cache is not None and state.depth.cache is not None
    assert state.backbone.cache is None and state.depth.cache is None
    state.close()                                   # closing again is harmless
