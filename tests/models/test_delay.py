"""DelayModel (models/delay.py) on the tiny upstream-named checkpoint, converted with --strict
and loaded by the real loader, against the float64 reference fixtures/reference/delay.py:
forward(rows) (hidden, text and audio logits), greedy generation row for row (KV-cached steps
vs the reference's full recompute), and bad input."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_delay import AUDIO_VOCAB, N_VQ
from fixtures.reference import delay as ref
from moss_tts.errors import InputError, ModelFileError
from moss_tts.ggml import F16, Weights, get_backend
from moss_tts.models.delay import DelayModel
from moss_tts.text.delay_prompts import delay
from moss_tts.sampling import DelaySamplingOptions

# f32 ggml vs float64 through 2 Qwen3 blocks (bf16-valued weights are exact in f32) and the
# final norm: |h| ≲ 4, ≤ 48-term dots; measured ≤ 2e-6. Logits add one 32-term dot.
HIDDEN_ATOL = 2e-5
LOGIT_ATOL = 1e-4
# K and V stored in f16 (rel. 2^-11) and q rounded to f16 for the q·k dot by the kernels
F16_KV_ATOL = 1e-2
PAD_CODE = AUDIO_VOCAB
IM_START, IM_END, START, END, USER, GEN, DELAY = 151644, 151645, 151652, 151653, 151654, 151656, 151662
GREEDY = DelaySamplingOptions().greedy()


def prompt_rows(seed=3, reference=True):
    """A voice-clone-shaped prompt: text, a reference block (AUDIO_START, user slots carrying
    the delayed codes of 5 frames, AUDIO_END), text, then an AUDIO_START row, as the model
    samples first (generation goes on in audio). Without `reference`, the block is dropped."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, AUDIO_VOCAB, size=(5, N_VQ))
    block = np.full((len(codes) + N_VQ + 1, N_VQ + 1), PAD_CODE)
    block[:, 0] = [START] + [USER] * (len(codes) + N_VQ - 1) + [END]
    block[1:-1, 1:] = delay(codes, PAD_CODE)
    text = lambda ids: np.column_stack([ids, np.full((len(ids), N_VQ), PAD_CODE)])  # noqa: E731
    parts = [text([IM_START, 267, 198] + list(rng.integers(300, 400, 4))), block,
             text([IM_END, 198, IM_START, 201, 198, START])]
    return np.vstack(parts if reference else parts[::2]).astype(np.int64)


def test_forward_matches_reference(delay_model, delay_files):
    _, state, cfg, _ = delay_files()
    rows = prompt_rows()
    hidden, text, audio = delay_model().forward(rows)
    want_h = ref.hidden(state, cfg, rows)
    want_text, want_audio = ref.heads(state, cfg, want_h)
    assert_close(hidden, want_h, atol=HIDDEN_ATOL, what="hidden")
    assert_close(text, want_text, atol=LOGIT_ATOL, what="text logits")
    assert audio.shape == (N_VQ, len(rows), PAD_CODE + 1)
    assert np.isneginf(audio[:, :, PAD_CODE]).all()
    assert_close(audio[:, :, :PAD_CODE], want_audio[:, :, :PAD_CODE], atol=LOGIT_ATOL,
                 what="audio logits")
    # guards: the pad rows of emb_ext are learned vectors that count (P1), and each head is
    # its own codebook's
    no_pad = {**state, **{f"emb_ext.{k}.weight": state[f"emb_ext.{k}.weight"].copy()
                          for k in range(N_VQ)}}
    for k in range(N_VQ):
        no_pad[f"emb_ext.{k}.weight"][PAD_CODE] = 0
    assert_differs(hidden, ref.hidden(no_pad, cfg, rows), atol=HIDDEN_ATOL, what="pad rows zeroed")
    assert_differs(audio[1, :, :PAD_CODE], want_audio[0, :, :PAD_CODE], atol=LOGIT_ATOL,
                   what="head 1 vs head 0")


def test_f16_kv_cache_stays_within_f16_rounding(delay_model, delay_files):
    """The default KV type (F16, as upstream's llama.cpp route) moves the hidden state by the
    f16 rounding of K and V only (measured ≤ 2e-3 on |h| ≲ 4)."""
    _, state, cfg, _ = delay_files()
    rows = prompt_rows()
    hidden, _, _ = delay_model(0.0, F16).forward(rows)
    want = ref.hidden(state, cfg, rows)
    assert_close(hidden, want, atol=F16_KV_ATOL, what="hidden with an f16 KV cache")
    assert_differs(hidden, delay_model().forward(rows)[0], atol=HIDDEN_ATOL, what="f16 vs f32 KV")


@pytest.mark.parametrize("gen_bias, penalty", [(0.0, 1.0), (4.0, 1.0), (4.0, 3.0)],
                         ids=["short_audio", "long_audio", "long_audio_penalty"])
def test_greedy_generation_matches_reference_row_for_row(delay_model, delay_files, gen_bias,
                                                         penalty):
    """KV-cached generation (prefill + replayed steps) == the reference recomputing the whole
    sequence every step. The default model flushes after 1 GEN row (DELAY ×4, the forced
    AUDIO_END, then text); the gen_bias model stays in audio for many rows, every codebook on."""
    _, state, cfg, _ = delay_files(gen_bias)
    model = delay_model(gen_bias)
    rows = prompt_rows()
    opts = DelaySamplingOptions(audio_repetition_penalty=penalty).greedy()
    got = model.generate(rows, options=opts, max_new_rows=16)
    want = ref.generate_greedy(state, cfg, rows, 16, repetition_penalty=penalty)
    np.testing.assert_array_equal(got, want)
    if gen_bias:
        assert (got[:, 1:] != PAD_CODE).all(axis=1).sum() >= 4, "the staircase never filled"
    else:
        assert got[:, 0].tolist()[:6] == [GEN] + [DELAY] * N_VQ + [END]
    # guard: another prompt generates other rows
    other = model.generate(prompt_rows(seed=4), options=opts, max_new_rows=16)
    assert not np.array_equal(other, got)


def test_repetition_penalty_changes_greedy_codes(delay_model):
    """With no reference codes in the history, a penalty moves the greedy codes (with every
    code already seen it cannot: dividing all positive logits keeps their order)."""
    rows = prompt_rows(reference=False)
    plain = delay_model(4.0).generate(rows, options=GREEDY, max_new_rows=16)
    penalized = delay_model(4.0).generate(rows, max_new_rows=16, options=DelaySamplingOptions(
        audio_repetition_penalty=3.0).greedy())
    assert not np.array_equal(plain, penalized)


def test_sampled_generation_is_reproducible_for_a_seed(delay_model):
    rows, model = prompt_rows(), delay_model(4.0)
    a = model.generate(rows, seed=5, max_new_rows=12)
    b = model.generate(rows, seed=5, max_new_rows=12)
    c = model.generate(rows, seed=6, max_new_rows=12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("bad, match", [
    (np.zeros((3, N_VQ), dtype=np.int64), "shape"),
    (np.full((2, N_VQ + 1), PAD_CODE + 1), "audio codes"),
    (np.array([[151680] + [PAD_CODE] * N_VQ]), "text ids"),
    (np.zeros((2, N_VQ + 1), dtype=np.float32), "integers"),
])
def test_bad_rows_raise_input_error(delay_model, bad, match):
    with pytest.raises(InputError, match=match):
        delay_model().forward(bad)


def test_nano_gguf_given_as_delay_raises_model_file_error(nano_files):
    _, gguf = nano_files()
    with pytest.raises(ModelFileError, match="expected a delay GGUF, found a 'nano' model"):
        DelayModel(Weights.load(gguf, get_backend(None, 1)))


def test_config_rejects_pad_code_outside_tables_and_ids_outside_vocab():
    from moss_tts.errors import ConfigError
    from moss_tts.models.delay import DelayConfig
    from moss_tts.models.qwen3 import Qwen3Config

    lc = Qwen3Config(16, 1, 2, 1, 8, 16, 1e6)
    with pytest.raises(ConfigError, match="audio_pad_code 17 is outside the 17 rows"):
        DelayConfig(lc, vocab_size=151680, audio_vocab_size=16, audio_pad_code=17)
    with pytest.raises(ConfigError, match="special id 151662 lies outside the text vocabulary"):
        DelayConfig(lc, vocab_size=151643 + 10, audio_vocab_size=16, audio_pad_code=16)


def test_generation_budget_must_be_positive(delay_model):
    with pytest.raises(InputError, match="max_new_rows must be at least 1"):
        delay_model().generate(prompt_rows(), max_new_rows=0)
