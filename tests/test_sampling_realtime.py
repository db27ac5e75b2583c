"""RealtimeSamplingOptions (upstream defaults and validation) and `sample_top_k_token`, the
sampler the Realtime frames use: the same id as `sample_token` for the same generator state."""

import numpy as np
import pytest

from moss_tts.errors import InputError
from moss_tts.sampling import RealtimeSamplingOptions, sample_token, sample_top_k_token


def test_defaults_are_upstreams():
    o = RealtimeSamplingOptions()
    assert (o.do_sample, o.audio_temperature, o.audio_top_p, o.audio_top_k,
            o.audio_repetition_penalty, o.repetition_window) == (True, 0.8, 0.6, 30, 1.1, 50)


@pytest.mark.parametrize("top_k, top_p, temperature", [(30, 0.6, 0.8), (5, 1.0, 1.3),
                                                        (1, 0.9, 0.5), (0, 0.6, 0.8),
                                                        (2000, 0.95, 1.0)])
def test_top_k_sampler_draws_what_the_whole_vocabulary_sampler_draws(top_k, top_p, temperature):
    logits = np.random.default_rng(0).standard_normal((200, 1027)) * 3
    logits[7, :40] = logits[7, 0]              # ties at the top-k threshold survive in both
    for i, z in enumerate(logits):
        a = sample_token(z, np.random.default_rng(i), temperature=temperature, top_k=top_k,
                         top_p=top_p)
        b = sample_top_k_token(z, np.random.default_rng(i), temperature=temperature,
                               top_k=top_k, top_p=top_p)
        assert a == b, i
    # guard: another generator state draws other ids somewhere
    draws = {sample_top_k_token(logits[0], np.random.default_rng(s), temperature=1.0, top_k=30)
             for s in range(20)}
    assert len(draws) > 1


@pytest.mark.parametrize("kw, match", [
    ({"audio_temperature": 0}, "audio_temperature must be finite and > 0"),
    ({"audio_top_p": 0}, "audio_top_p must be in"),
    ({"audio_top_k": -1}, "audio_top_k must be a whole number"),
    ({"audio_repetition_penalty": 0}, "audio_repetition_penalty must be finite"),
    ({"repetition_window": 0}, "repetition_window must be a whole number"),
    ({"do_sample": "yes"}, "do_sample must be True or False"),
    ({"audio_temperature": "hot"}, "audio_temperature must be a number"),
    ({"repetition_window": None}, "repetition_window must be a number"),
])
def test_bad_options_raise_input_error(kw, match):
    with pytest.raises(InputError, match=match):
        RealtimeSamplingOptions(**kw)
    if kw == {"audio_temperature": 0}:      # greedy takes any temperature
        RealtimeSamplingOptions(do_sample=False, **kw)
