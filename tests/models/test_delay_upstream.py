"""Every Delay checkpoint's prompt as upstream's own apps build it, and greedy generation from
it, against fixtures/data/delay_upstream.json — made once by upstream's code
(`python bench/delay_upstream.py --golden ...`: OpenMOSS/MOSS-TTS `moss_tts_delay`
`MossTTSDelayProcessor.__call__` and `MossTTSDelayModel.generate`, the TTSD app's dialogue
functions, mlx-audio's port of MOSS-VoiceGenerator's normalizers) on the tiny checkpoints of
fixtures.make_delay, compared exactly.

- generation mode (`processor(..., mode="generation")`): the prompt ends at `assistant\\n` and
  the model samples AUDIO_START itself under `generate`'s step-0 masks — MOSS-TTS direct and
  cloned (`clis/moss_tts_app.py`), MOSS-TTSD without references, MOSS-VoiceGenerator,
  MOSS-SoundEffect;
- MOSS-TTSD with S1 cloned and S2 left to the model (`clis/moss_ttsd_app.py` run_inference:
  references [S1, None], S1's speech as the continuation);
- MOSS-VoiceGenerator with `normalize_inputs` (its card and app): text and instruction cleaned
  by its processor's own rules (text/voice_design.py).

The `noisy` weights make upstream sample text tokens before AUDIO_START, DELAY, the flush and
AUDIO_END: the whole state machine, not only its audio rows.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from fixtures.make_delay import tiny_config
from moss_tts.ggml import F32
from moss_tts.models.delay_tts import DelayTTS
from moss_tts.models.registry import family_of_model
from moss_tts.reference import Reference
from moss_tts.sampling import DelaySamplingOptions

from .conftest import THREADS

FIXTURE = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "data" /
                      "delay_upstream.json").read_text())
CASES = {f"{c['name']}-{c['weights']}": c for c in FIXTURE["cases"]}
AUDIO_START = tiny_config()["audio_start_token_id"]     # the fixture's checkpoints' id


@pytest.fixture(scope="module")
def tts_of(delay_files, published_files, v1_codec_gguf):
    """(kind, weights) → its TTS on the fixture's tiny weights (gen_bias 4; f32 KV cache)."""
    made = {}

    def get(kind, weights):
        if (kind, weights) not in made:
            steady = weights == "steady"
            gguf = delay_files(4.0, steady)[3] if kind == "tts" else \
                published_files(kind, 4.0, steady)[2]
            cls = DelayTTS if kind == "tts" else family_of_model(gguf).tts_class()
            made[kind, weights] = cls.load(gguf, codec=v1_codec_gguf, threads=THREADS,
                                           kv_type=F32)
        return made[kind, weights]

    yield get
    for tts in made.values():
        tts.close()


def asked(case) -> dict:
    """The fixture's request as the port's API takes it."""
    kw = dict(case["asked"])
    if "reference" in kw:
        kw["reference"] = Reference(np.array(kw["reference"]))
    if "speakers" in kw:
        kw["speakers"] = {int(n): (Reference(np.array(codes)), transcript)
                          for n, (codes, transcript) in kw["speakers"].items()}
    return kw


@pytest.mark.parametrize("name", sorted(CASES))
def test_prompt_rows_equal_upstreams_processor(tts_of, name):
    case = CASES[name]
    rows = tts_of(case["kind"], case["weights"]).plan(**asked(case))
    np.testing.assert_array_equal(rows, np.array(case["prompt"]))
    if case["mode"] == "generation":      # upstream's generation prompt: no AUDIO_START row
        assert rows[-1, 0] != AUDIO_START


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_rows_equal_upstreams_generate(tts_of, name):
    """End to end: the port's own prompt (`plan`), then its greedy rows, equal upstream's
    `generate` from its processor's prompt."""
    case = CASES[name]
    tts = tts_of(case["kind"], case["weights"])
    got = tts.model.generate(tts.plan(**asked(case)), options=DelaySamplingOptions().greedy(),
                             max_new_rows=FIXTURE["max_new_rows"])
    np.testing.assert_array_equal(got, np.array(case["rows"]))


def test_the_fixture_covers_what_the_issue_names():
    """Every Delay checkpoint in generation mode, a TTSD speaker left to the model, an
    instruction normalization changes, and rows that leave audio (guards on the fixture)."""
    kinds = {c["kind"] for c in FIXTURE["cases"] if c["mode"] == "generation"}
    assert kinds == {"tts", "ttsd", "voicegen", "sfx"}
    s2 = CASES["ttsd_s2_left-steady"]
    assert s2["mode"] == "continuation" and "[S2]" in s2["asked"]["text"]
    assert set(s2["asked"]["speakers"]) == {"1"}
    vg = CASES["voicegen-steady"]["asked"]["instruction"]
    from moss_tts.text.voice_design import normalize_instruction
    assert normalize_instruction(vg) != vg
    texts = [t for c in FIXTURE["cases"] for t in np.array(c["rows"])[:, 0]]
    assert {151652, 151656, 151662, 151653}.issubset(texts)       # START, GEN, DELAY, END
    assert any(np.array(c["rows"])[0, 0] not in (151652, 151656) for c in FIXTURE["cases"])
