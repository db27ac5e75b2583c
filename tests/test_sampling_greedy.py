"""Greedy is each family's upstream greedy (issue 22 #7, design §5). Read from upstream
(OpenMOSS/MOSS-TTS 58b20a0, OpenMOSS/MOSS-TTS-Nano's HF modeling code):

- MossTTSLocal (`_build_generation_config` + `CustomMixin._sample`): a temperature of 0 makes
  that channel do_sample=False (here the switches `text_do_sample` / `audio_do_sample`, issue
  31), and `_sample` builds no processor for it — the argmax of the raw logits (audio: pad
  −inf), no repetition penalty.
- MossTTSDelay (`generate` + inference_utils.sample_token): temperature 0 = do_sample=False per
  channel; `sample_token` applies the audio penalty *before* its `if not do_sample` argmax.
- Nano and Local v1.5 (`_sample_next_token`): one do_sample for every channel; the penalty runs
  before the argmax.
- Realtime (`generate_local_transformer` + `sample_token`): one do_sample; the windowed penalty
  runs before the argmax.

So on logits where the penalty moves the argmax, Local's greedy ignores it and every other
family's greedy follows it: one test each way (the second is the first's sensitivity guard).
"""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from moss_tts.errors import InputError
from moss_tts.models.local import choose
from moss_tts.models.local_v15 import decide
from moss_tts.models.realtime import choose_code
from moss_tts.sampling import (
    DelaySamplingOptions,
    LocalSamplingOptions,
    LocalV15SamplingOptions,
    RealtimeSamplingOptions,
    SamplingOptions,
    choose_rows,
    sample_audio_code,
)

PAD = 4
# the pad code (4) is the largest logit, and code 1 wins only until a penalty > 1.06 divides it
LOGITS = np.array([0.5, 2.0, 1.9, -1.0, 3.0])
SEEN = np.array([False, True, False, False, False])    # code 1 was generated before
PLAIN, PENALIZED = 1, 2
FAMILIES = [SamplingOptions, LocalV15SamplingOptions, RealtimeSamplingOptions,
            DelaySamplingOptions, LocalSamplingOptions]


@pytest.mark.parametrize("cls", FAMILIES, ids=lambda c: c.__name__)
def test_greedy_returns_the_same_options_with_greedy_on(cls):
    default = cls()
    greedy = default.greedy()
    assert not default.is_greedy and greedy.is_greedy
    assert type(greedy) is cls and greedy.greedy() == greedy
    assert greedy.audio_channel.greedy and not default.audio_channel.greedy
    # only the switch changes: the penalty and the filters are the user's
    assert greedy.audio_repetition_penalty == default.audio_repetition_penalty
    assert greedy.audio_top_k == default.audio_top_k


@pytest.mark.parametrize("cls", [DelaySamplingOptions, LocalSamplingOptions],
                         ids=lambda c: c.__name__)
def test_each_channel_has_its_own_greedy_switch(cls):
    """Delay and Local switch per channel, as upstream's do_samples list."""
    text_only = cls(text_do_sample=False)
    assert text_only.text_greedy and text_only.text_channel.greedy
    assert not text_only.audio_greedy and not text_only.audio_channel.greedy
    assert not text_only.is_greedy
    audio_only = cls(audio_do_sample=False)
    assert audio_only.audio_channel.greedy and not audio_only.text_channel.greedy
    assert cls().greedy() == cls(text_do_sample=False, audio_do_sample=False)


@pytest.mark.parametrize("cls, field", [
    (cls, field) for cls in FAMILIES for field in ("text_temperature", "audio_temperature")
    if field in {f.name for f in dataclasses.fields(cls)}],    # Realtime's has no text one
    ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_a_zero_temperature_is_refused_alike_by_every_family(cls, field):
    """One rule (issue 31, finding 10): a temperature of 0 was greedy for Delay and Local and
    an error for Nano, Local v1.5 and Realtime; greedy is the switch on every family (C19)."""
    with pytest.raises(InputError, match=f"^{field} must be finite and > 0, got 0 .*`greedy`"):
        cls(**{field: 0})
    assert cls().greedy().is_greedy


def test_local_greedy_audio_runs_no_penalty():
    """MossTTSLocal: the plain argmax (pad masked), whatever the penalty — through the
    model's own channel sampler, with no generator (greedy draws nothing)."""
    cfg = SimpleNamespace(audio_pad_code=PAD)
    for penalty in (1.1, 3.0):
        opts = LocalSamplingOptions(audio_repetition_penalty=penalty).greedy()
        assert opts.audio_channel.repetition_penalty == 1.0
        assert choose(LOGITS, 1, SEEN[None], cfg, opts, None) == PLAIN
    # a sampled audio channel next to a greedy text channel keeps its penalty
    assert LocalSamplingOptions(text_do_sample=False).audio_channel.repetition_penalty == 1.1


def test_local_greedy_text_is_the_argmax():
    cfg = SimpleNamespace(audio_pad_code=PAD)
    assert choose(LOGITS, 0, SEEN[None], cfg, LocalSamplingOptions().greedy(), None) == 4


def test_delay_greedy_audio_keeps_the_penalty():
    """Guard for the Local test: the same logits and history under Delay's greedy (penalty
    before the argmax, as its sample_token) give the penalized code; without it the plain."""
    scores = np.where(np.arange(5) == PAD, -np.inf, LOGITS)[None]
    penalized = DelaySamplingOptions(audio_repetition_penalty=1.1).greedy()
    assert choose_rows(scores, None, penalized.audio_channel, SEEN)[0] == PENALIZED
    assert choose_rows(scores, None, DelaySamplingOptions().greedy().audio_channel,
                       SEEN)[0] == PLAIN      # its default penalty is 1.0 (off)


@pytest.mark.parametrize("opts", [SamplingOptions(), LocalV15SamplingOptions(
    audio_repetition_penalty=1.2)], ids=["nano", "local_v15"])
def test_nano_and_local_v15_greedy_keep_the_penalty(opts):
    logits = LOGITS[:PAD]                                   # no pad column in these heads
    assert sample_audio_code(logits, SEEN[:PAD], None, opts.greedy()) == PENALIZED
    assert sample_audio_code(logits, np.zeros(PAD, bool), None, opts.greedy()) == PLAIN


def test_local_v15_greedy_decision_is_the_argmax():
    greedy = LocalV15SamplingOptions().greedy()
    assert decide(np.array([0.2, 0.1]), None, greedy) == 0
    assert decide(np.array([0.1, 0.2]), None, greedy) == 1
    assert decide(np.array([0.3, 0.3]), None, greedy) == 0      # continue on a tie


def test_realtime_greedy_keeps_the_windowed_penalty():
    greedy = RealtimeSamplingOptions().greedy()            # penalty 1.1
    logits = LOGITS[:PAD]
    assert choose_code(logits, SEEN[:PAD], greedy, None) == PENALIZED
    assert choose_code(logits, None, greedy, None) == PLAIN   # a turn's first frame: none


def test_greedy_ignores_the_sampling_knobs():
    """A greedy channel's temperature, top-k and top-p play no part (upstream skips them)."""
    scores = np.array([[0.1, 0.3, 0.2]])
    for opts in (LocalSamplingOptions(audio_top_k=1, audio_top_p=0.1).greedy(),
                 SamplingOptions(audio_temperature=50.0, audio_top_k=1).greedy(),
                 RealtimeSamplingOptions(audio_top_p=0.01).greedy()):
        assert choose_rows(scores, None, opts.audio_channel)[0] == 1
