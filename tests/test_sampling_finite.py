"""Non-finite logits are a clear package error before any sampler sees them."""

import numpy as np
import pytest

from moss_tts.errors import MossTTSError
from moss_tts.sampling import SamplingOptions, decide_continue, sample_audio_code

SAMPLED, GREEDY = SamplingOptions(), SamplingOptions(do_sample=False)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("opts", [SAMPLED, GREEDY])
def test_non_finite_audio_logits_raise_a_package_error(rng, bad, opts):
    logits = rng.standard_normal(16)
    logits[3] = bad
    with pytest.raises(MossTTSError, match="non-finite audio logit"):
        sample_audio_code(logits, np.zeros(16, bool), rng, opts)


@pytest.mark.parametrize("pair", [(np.nan, 0.0), (0.0, np.inf)])
@pytest.mark.parametrize("opts", [SAMPLED, GREEDY])
def test_non_finite_stop_logits_raise_a_package_error(rng, pair, opts):
    with pytest.raises(MossTTSError, match="non-finite stop/continue"):
        decide_continue(*pair, rng, opts)


def test_finite_logits_still_sample(rng):
    assert 0 <= sample_audio_code(rng.standard_normal(16), np.zeros(16, bool), rng, SAMPLED) < 16
    assert decide_continue(1.0, 0.0, rng, GREEDY) is True
