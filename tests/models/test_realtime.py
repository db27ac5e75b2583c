"""RealtimeModel (models/realtime.py) on the tiny upstream-named checkpoint, converted with
--strict and loaded by the real loader, against the float64 reference
fixtures/reference/realtime.py: the backbone's hidden states, the local stack with its table
shift (P16), greedy generation frame for frame (KV-cached backbone steps and per-frame local
caches vs the reference's full recomputes), the stop on codebook 0 only, the sanitizer, and
bad input."""

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_realtime import AUDIO_VOCAB, CODEBOOK, RVQ, TEXT_PAD
from fixtures.reference import realtime as ref
from moss_tts.errors import ConfigError, InputError, ModelFileError
from moss_tts.ggml import Weights, get_backend
from moss_tts.models.qwen3 import Qwen3Config
from moss_tts.models.realtime import RealtimeConfig, RealtimeModel, sanitized
from moss_tts.sampling import RealtimeSamplingOptions

GREEDY = RealtimeSamplingOptions(do_sample=False)   # the penalty (1.1) stays on, as upstream


# f32 ggml vs float64 through 2 Qwen3 blocks and the final norm (bf16-valued weights are
# exact in f32): |h| ≲ 4 and ≤ 48-term dots, measured ≤ 2e-6. Logits add a 32-term dot.
HIDDEN_ATOL = 2e-5
LOGIT_ATOL = 1e-4
BOS, EOS = CODEBOOK + 1, CODEBOOK + 2


def prompt_rows(seed=3, n=20):
    """Text rows with a block of reference frames, ending on a lead row with BOS on
    codebook 0."""
    rng = np.random.default_rng(seed)
    rows = np.full((n, RVQ + 1), CODEBOOK, dtype=np.int64)
    rows[:, 0] = rng.integers(300, 400, n)
    rows[4:9, 1:] = rng.integers(0, CODEBOOK, (5, RVQ))
    rows[-1, 1] = BOS
    return rows


def test_forward_matches_reference(realtime_model, realtime_files):
    state, cfg, _ = realtime_files()
    rows = prompt_rows()
    hidden = realtime_model().forward(rows)
    assert_close(hidden, ref.hidden(state, cfg, rows), atol=HIDDEN_ATOL, what="hidden")
    # guard: every audio table counts, each on its own codebook
    swapped = rows.copy()
    swapped[:, [1, 2]] = swapped[:, [2, 1]]
    assert_differs(hidden, ref.hidden(state, cfg, swapped), atol=HIDDEN_ATOL,
                   what="codebooks 0 and 1 swapped")


def test_local_stack_matches_reference_with_its_table_shift(realtime_model, realtime_files):
    """Head j reads local position j, whose input is local table j−1 at code j−1 (P16)."""
    state, cfg, _ = realtime_files()
    model = realtime_model()
    h = model.forward(prompt_rows())[-1]
    codes = np.array([5, BOS, 63, EOS])       # any of the 67 codes feeds the next position
    got = model.local_logits(h, codes)
    assert got.shape == (RVQ, AUDIO_VOCAB)
    assert_close(got, ref.local_logits(state, cfg, h, codes), atol=LOGIT_ATOL, what="local")
    # guard: without the shift (table j at position j) the logits move
    unshifted = dict(state)
    for j in range(RVQ - 1):
        unshifted[f"local_transformer.model.embed_tokens.{j}.weight"] = \
            state[f"local_transformer.model.embed_tokens.{min(j + 1, RVQ - 2)}.weight"]
    assert_differs(got[1:], ref.local_logits(unshifted, cfg, h, codes)[1:], atol=LOGIT_ATOL,
                   what="local tables unshifted")
    # the last code feeds nothing: changing it changes no logit
    np.testing.assert_array_equal(model.local_logits(h, [5, BOS, 63, 0]), got)


@pytest.mark.parametrize("steer, penalty, window", [(False, 1.0, 50), (True, 1.0, 50),
                                                     (True, 1.5, 4)])
def test_greedy_generation_matches_reference_frame_for_frame(realtime_model, realtime_files,
                                                             steer, penalty, window):
    """The default model runs to max_frames here; the steered one speaks one frame per text id
    (11 after the lead) and stops on the first <|text_pad|> row (the EOS frame is not
    returned)."""
    state, cfg, _ = realtime_files(steer)
    rows, text = prompt_rows(), list(range(311, 322))
    opts = RealtimeSamplingOptions(do_sample=False, audio_repetition_penalty=penalty,
                                   repetition_window=window)
    got = realtime_model(steer).generate(rows, text, options=opts, max_frames=20)
    want = ref.generate_greedy(state, cfg, rows, text, 20, penalty=penalty, window=window)
    assert len(got) == (len(text) + 1 if steer else 20)
    np.testing.assert_array_equal(got, want)
    # guard: another prompt generates other frames
    other = realtime_model(steer).generate(prompt_rows(seed=4), text, options=opts,
                                           max_frames=20)
    assert not np.array_equal(other, got)


def test_repetition_penalty_and_its_window_change_greedy_frames(realtime_model):
    rows, text = prompt_rows(), list(range(311, 322))
    frames = {(p, w): realtime_model(True).generate(rows, text, options=RealtimeSamplingOptions(
                  do_sample=False, audio_repetition_penalty=p, repetition_window=w))
              for p, w in ((1.0, 50), (3.0, 50), (3.0, 1))}
    assert not np.array_equal(frames[1.0, 50], frames[3.0, 50])
    assert not np.array_equal(frames[3.0, 1], frames[3.0, 50])


def test_max_frames_caps_generation(realtime_model):
    got = realtime_model(True).generate(prompt_rows(), list(range(311, 322)), options=GREEDY,
                                        max_frames=5)
    assert got.shape == (5, RVQ)


def test_sampled_generation_is_reproducible_for_a_seed(realtime_model):
    rows, text = prompt_rows(), [311, 322]
    a = realtime_model().generate(rows, text, seed=5, max_frames=10)
    b = realtime_model().generate(rows, text, seed=5, max_frames=10)
    c = realtime_model().generate(rows, text, seed=6, max_frames=10)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_sanitizer_cuts_at_the_first_frame_the_codec_cannot_take():
    cfg = tiny_realtime_config()
    frames = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, CODEBOOK, 1, 2], [1, 2, 3, 4]])
    np.testing.assert_array_equal(sanitized(frames, cfg), frames[:2])
    frames[1, 3] = EOS          # EOS on a codebook other than 0 ends the audio too
    np.testing.assert_array_equal(sanitized(frames, cfg), frames[:1])
    np.testing.assert_array_equal(sanitized(frames[:1], cfg), frames[:1])


def tiny_realtime_config(**kw):
    lc = Qwen3Config(32, 1, 4, 2, 16, 48, 1e6)
    return RealtimeConfig(lc, lc, vocab_size=151680, rvq=RVQ, audio_pad_token=CODEBOOK,
                          audio_vocab_size=AUDIO_VOCAB, **kw)


def test_config_invariants_raise_config_error():
    with pytest.raises(ConfigError, match="audio_vocab_size 70 is not"):
        tiny_realtime_config().__class__(Qwen3Config(32, 1, 4, 2, 16, 48, 1e6),
                                         Qwen3Config(32, 1, 4, 2, 16, 48, 1e6), vocab_size=151680,
                                         audio_pad_token=64, audio_vocab_size=70)
    with pytest.raises(ConfigError, match="special id 151655 lies outside"):
        tiny_realtime_config(reference_audio_pad=0, pad_token_id=0, im_start_token_id=0,
                             im_end_token_id=0).__class__(
            Qwen3Config(32, 1, 4, 2, 16, 48, 1e6), Qwen3Config(32, 1, 4, 2, 16, 48, 1e6),
            vocab_size=151650, audio_pad_token=64, audio_vocab_size=67, reference_audio_pad=0,
            pad_token_id=0, im_start_token_id=0, im_end_token_id=0)


@pytest.mark.parametrize("bad, match", [
    (np.zeros((3, RVQ), dtype=np.int64), "shape"),
    (np.full((2, RVQ + 1), AUDIO_VOCAB), "audio codes"),
    (np.array([[151680] + [CODEBOOK] * RVQ]), "text ids"),
    (np.zeros((2, RVQ + 1), dtype=np.float32), "integers"),
])
def test_bad_rows_raise_input_error(realtime_model, bad, match):
    with pytest.raises(InputError, match=match):
        realtime_model().forward(bad)


def test_bad_local_inputs_and_budget_raise_input_error(realtime_model):
    model = realtime_model()
    with pytest.raises(InputError, match="local_logits takes"):
        model.local_logits(np.zeros(32), [1, 2, 3])
    with pytest.raises(InputError, match="local_logits takes"):
        model.local_logits(np.zeros(32), [1, 2, 3, AUDIO_VOCAB])
    with pytest.raises(InputError, match="max_frames must be at least 1"):
        model.generate(prompt_rows(), max_frames=0)
    assert TEXT_PAD == model.config.text_pad


@pytest.mark.parametrize("family", ["nano", "delay"])
def test_other_family_gguf_given_as_realtime_raises_model_file_error(family, nano_files,
                                                                     delay_files):
    gguf = nano_files()[1] if family == "nano" else delay_files()[3]
    with pytest.raises(ModelFileError, match=f"expected a realtime GGUF, found a '{family}'"):
        RealtimeModel(Weights.load(gguf, get_backend(None, 1)))


def test_only_eos_on_codebook_0_ends_a_turn(realtime_model):
    """P6: EOS (or pad / BOS) drawn on codebooks 1..15 does not stop generation (the
    sanitizer ends that audio instead); EOS on codebook 0 does."""
    with realtime_model().stream(64) as s:
        s.turn.frames = [np.array([3, EOS, EOS, BOS])]
        assert not s.finished
        s.turn.frames = [np.array([EOS, 1, 2, 3])]
        assert s.finished


def test_greedy_frames_equal_upstream_pytorch(tmp_path):
    """Upstream's own PyTorch code (MossTTSRealtimeInference.prefill/step, f32, greedy,
    penalty 1.1) on the tiny checkpoint with upstream's fixed local shape (16 codebooks of
    1027) drew the frames in fixtures/data/realtime_upstream_greedy.json (made by
    `bench/realtime.py --tiny --peer PY --golden ...`); ours, through the converter, draws
    the same."""
    import json
    from pathlib import Path

    from converters.realtime import convert
    from fixtures.make_realtime import make_tiny_realtime_checkpoint, tiny_config

    golden = json.loads((Path(__file__).parents[2] / "fixtures" / "data" /
                         "realtime_upstream_greedy.json").read_text())
    ckpt = make_tiny_realtime_checkpoint(tmp_path / "hf", seed=0, config=tiny_config(
        rvq=16, audio_pad_token=1024, audio_vocab_size=1027, sampling_rate=24000))
    with RealtimeModel(Weights.load(convert(str(ckpt), tmp_path / "r.gguf", strict=True),
                                    get_backend(None, 1))) as model:
        cfg, text = model.config, golden["text"]
        lead = np.full((12, cfg.rvq + 1), cfg.audio_pad_token)
        lead[:, 0], lead[-1, 1] = text[:12], cfg.audio_bos
        rows = np.vstack([np.array(golden["prompt"]), lead])
        want = np.array(golden["frames"])
        got = model.generate(rows, text[12:], options=GREEDY, max_frames=len(want))
        np.testing.assert_array_equal(got, want)
        # guard: BOS one row early (on the 11th lead token) draws other frames
        early = rows.copy()
        early[-1, 1], early[-2, 1] = cfg.audio_pad_token, cfg.audio_bos
        assert not np.array_equal(model.generate(early, text[12:], options=GREEDY,
                                                 max_frames=len(want)), want)
