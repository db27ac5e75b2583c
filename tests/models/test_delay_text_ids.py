"""models/delay.py's few-ids text head: in audio (or on a forced flush row) a step computes only
the text logits the next row may take (P3), and generation is the same as with the whole
vocabulary's logits."""

import numpy as np

from fixtures.compare import assert_close
from moss_tts.models import delay as delay_model_module
from moss_tts.models.delay import FEW_TEXT_IDS, few_text_ids, row_feed, step_run
from moss_tts.models.delay_state import DelayState

from .test_delay import GEN, DELAY, END, prompt_rows

# f32 weights: the gathered rows and the full head differ only in summation order
LOGIT_ATOL = 1e-4


def test_few_ids_follow_the_state_machine(delay_model):
    cfg = delay_model().config
    assert few_text_ids(DelayState(), cfg) is None                       # outside audio
    assert list(few_text_ids(DelayState(is_audio=True, audio_len=1), cfg)) == [GEN, GEN]  # step 0
    assert list(few_text_ids(DelayState(is_audio=True, audio_len=5, step=3), cfg)) == [GEN, DELAY]
    flush = DelayState(is_audio=True, audio_len=5, delayed=4, step=9)       # DELAY is forced
    assert len(few_text_ids(flush, cfg)) == FEW_TEXT_IDS


def test_step_logits_of_the_few_ids_equal_the_full_head(delay_model):
    model = delay_model()
    cfg, rows = model.config, prompt_rows()
    state = DelayState(is_audio=True, audio_len=5, step=3)
    with model.make_session(len(rows)) as a, model.make_session(len(rows)) as b:
        full = a.run(row_feed(rows), len(rows), variant=True)
        text, audio = step_run(b, rows, state, cfg)
    assert_close(text[[GEN, DELAY]], full["text_logits"][0, [GEN, DELAY]], atol=LOGIT_ATOL,
                 what="few-ids text logits")
    assert np.isneginf(np.delete(text, [GEN, DELAY])).all()
    assert_close(audio, full["audio_logits"][0], atol=LOGIT_ATOL, what="audio logits")
    # guard: the ids fed are the ones computed (END's logit is not GEN's)
    assert abs(full["text_logits"][0, END] - full["text_logits"][0, GEN]) > LOGIT_ATOL


def test_sampled_generation_is_unchanged_by_the_few_ids_head(delay_model, monkeypatch):
    model = delay_model(gen_bias=4.0, steady=False)   # GEN favoured on a noisy channel:
    # some GEN rows, then a DELAY draw leaves audio
    rows = prompt_rows()
    few = model.generate(rows, seed=11, max_new_rows=48)
    monkeypatch.setattr(delay_model_module, "few_text_ids", lambda state, cfg: None)
    full = model.generate(rows, seed=11, max_new_rows=48)
    np.testing.assert_array_equal(few, full)
    # both heads ran: sampled rows in audio (few ids), then text after AUDIO_END (vocabulary)
    text = list(few[:, 0])
    assert text.count(GEN) >= 3 and END in text and len(text) > text.index(END) + 3
