"""MossTTSLocal greedy is upstream's greedy (issue 22 #7): upstream's own PyTorch `generate`
(OpenMOSS/MOSS-TTS moss_tts_local, f32, text_temperature = audio_temperature = 0) drew the rows
in fixtures/data/local_upstream_greedy.json on the tiny checkpoints (made by
`python bench/local_upstream.py SRC --golden fixtures/data/local_upstream_greedy.json` in a
venv with torch and transformers 5.0.0); ours, through the converter, draws the same. A
temperature of 0 is do_sample=False for that channel upstream, and `_sample` then runs no
processor on it — not even the 1.1 repetition penalty."""

import json
from pathlib import Path

import numpy as np
import pytest

from fixtures.reference import local as ref
from moss_tts.sampling import LocalSamplingOptions

GOLDEN = json.loads((Path(__file__).parents[2] / "fixtures" / "data" /
                     "local_upstream_greedy.json").read_text())
CASES = GOLDEN["cases"]


def case_id(case):
    return (f"seed{case['seed']}_prompt{case['prompt_seed']}"
            f"_penalty{case['audio_repetition_penalty']}_nvq{case['n_vq_for_inference']}")


def options(case) -> LocalSamplingOptions:
    """The options upstream's generate got: both temperatures 0 (do_sample off on both
    channels), the case's penalty (or the 1.1 default) — what `tts --greedy` builds."""
    penalty = case["audio_repetition_penalty"]
    return LocalSamplingOptions(**({} if penalty is None else
                                   {"audio_repetition_penalty": penalty})).greedy()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_greedy_rows_equal_upstream_generate(local_model, case):
    model = local_model(case["seed"], speech=True)
    got = model.generate(np.array(case["prompt"]), options=options(case),
                         max_new_frames=case["max_new_frames"],
                         n_vq_for_inference=case["n_vq_for_inference"])
    np.testing.assert_array_equal(got, np.array(case["rows"]))


def test_greedy_method_draws_the_upstream_rows(local_model):
    """`LocalSamplingOptions().greedy()` (what `--greedy` is to build) is that same greedy."""
    case = CASES[0]
    model = local_model(case["seed"], speech=True)
    got = model.generate(np.array(case["prompt"]), options=LocalSamplingOptions().greedy(),
                         max_new_frames=case["max_new_frames"])
    np.testing.assert_array_equal(got, np.array(case["rows"]))


def test_golden_is_sensitive_to_the_penalty(local_files):
    """Guard: the independent float64 loop with the 1.1 penalty inside greedy (what we did
    before) leaves the golden rows, so the tests above can tell the two greedies apart."""
    case = CASES[0]
    assert case["audio_repetition_penalty"] is None and case["n_vq_for_inference"] is None
    _, state, cfg, _ = local_files(case["seed"], speech=True)
    prompt, want = np.array(case["prompt"]), np.array(case["rows"])
    penalized = ref.generate_greedy(state, cfg, prompt, case["max_new_frames"],
                                    repetition_penalty=1.1)
    plain = ref.generate_greedy(state, cfg, prompt, case["max_new_frames"],
                                repetition_penalty=1.0)
    assert not np.array_equal(penalized, want)
    np.testing.assert_array_equal(plain, want)
