"""MOSS-SoundEffect v2.0's text context (models/soundeffect_v2_text.py, docs/upstream-notes.md
§family-10.2): the duration suffix and the cleaning on hand-worked values; the context of the
tiny Qwen3 text encoder (fixtures.make_soundeffect_v2_text, through the real GGUF writer and
loader) against the float64 Qwen3 reference and against upstream's own WanPrompter +
Qwen3TextEncoder (fixtures/data/soundeffect_v2_text_upstream.json, written by
bench/soundeffect_v2_text_upstream.py)."""

import json
from pathlib import Path

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.make_soundeffect_v2_text import (SOURCE_PREFIX, make_text_state,
                                               qwen_tokenizer_json, tiny_text_config,
                                               write_text_encoder_gguf)
from fixtures.reference.delay import qwen3_stack
from moss_tts.ggml import GGUFFile, Weights, get_backend
from moss_tts.models.soundeffect_v2_text import (TEXT_LEN, TextEncoder, TextEncoderConfig,
                                                 clean_prompt, duration_seconds, positive_prompt)
from moss_tts.text.qwen_tokenizer import QwenTokenizer

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures/data/soundeffect_v2_text_upstream.json"
SEED = 0            # the bench's checkpoint seed (its fixture names it)
# f32 through two blocks against float64 at up to 512 positions (|x| ≲ 4, ≤ 48-term dots, f32
# RoPE angles up to 511 rad): measured ≤ 2.4e-6
F32_ATOL = 2e-5
# f32 ggml against upstream's f32 torch (sdpa) on the same weights, the fixture rounded to 1e-7:
# measured ≤ 2.8e-6
UPSTREAM_ATOL = 2e-5
LONG = " ".join(["Hello there, this is a tiny test of speech."] * 50)   # > 512 tiny tokens


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    path = write_text_encoder_gguf(tmp_path_factory.mktemp("sfx2_text") / "text.gguf", seed=SEED)
    enc = TextEncoder(Weights.load(path, get_backend(None, 1)),
                      QwenTokenizer.from_json(qwen_tokenizer_json()))
    yield path, enc
    enc.close()


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


# -- the prompt --------------------------------------------------------------------------------
@pytest.mark.parametrize("seconds, want", [(1.25, 1.2), (2.35, 2.4), (5, 5.0), (0.04, 0.0),
                                           (29.96, 30.0)])
def test_duration_is_python_round_to_one_decimal(seconds, want):
    # 1.25 is exactly representable and rounds to even; 2.35 is stored above 2.35
    assert duration_seconds(seconds) == want


def test_positive_prompt_strips_then_appends_the_suffix():
    assert positive_prompt("  rain on a tin roof \n", 1.25) == "rain on a tin roof duration: 1.2s"
    assert positive_prompt("", 3) == " duration: 3.0s"      # the cleaning strips the space


@pytest.mark.parametrize("text, want", [
    ("  a \t\n b  ", "a b"),                                  # runs of whitespace, ends
    ("cafÃ©", "café"),                                        # ftfy: mojibake undone
    ("“Hello”\u3000there ﬁne ，world", '"Hello" there fine ,world'),  # quotes, width, ligature
    ("a&amp;lt;b", "a<b"),                                    # ftfy unescapes without a '<'
    ("a < b &amp;amp; c", "a < b & c"),                      # with one, html.unescape twice
    (" duration: 3.0s", "duration: 3.0s"),
])
def test_clean_prompt_hand_worked(text, want):
    assert clean_prompt(text) == want


# -- the context -------------------------------------------------------------------------------
def reference_context(ids):
    """float64 final-norm rows of ids through the HF-named tiny state, zero-padded to 512."""
    config, state = tiny_text_config(), make_text_state(tiny_text_config(), SEED)
    out = np.zeros((TEXT_LEN, config["hidden_size"]))
    if len(ids):
        x = state[f"{SOURCE_PREFIX}embed_tokens.weight"][np.asarray(ids)].astype(np.float64)
        out[:len(ids)] = qwen3_stack(state, SOURCE_PREFIX, config, x)
    return out


def test_config_reads_back_from_the_gguf(encoder):
    path, enc = encoder
    with GGUFFile(path) as f:
        assert TextEncoderConfig.from_gguf(f) == enc.config
    assert enc.config.text_len == TEXT_LEN and enc.config.language_config.hidden_size == 32


@pytest.mark.parametrize("text", ["Hello there, rain duration: 5.0s", LONG])
def test_context_matches_the_float64_reference(encoder, text):
    _, enc = encoder
    ids = enc.token_ids(text)
    want = reference_context(ids)
    got = enc.context(text)
    assert got.shape == (TEXT_LEN, 32) and got.dtype == np.float32
    assert_close(got, want, atol=F32_ATOL, what="context")
    assert_differs(got, reference_context(ids[::-1]), atol=F32_ATOL, what="reversed ids")


def test_long_prompt_is_cut_to_text_len(encoder):
    _, enc = encoder
    full = enc.tokenizer.encode(clean_prompt(LONG))
    assert len(full) > TEXT_LEN
    assert enc.token_ids(LONG).tolist() == full[:TEXT_LEN]


@pytest.mark.parametrize("text", ["", "  \t\n "])
def test_empty_prompt_gives_all_zeros(encoder, text):
    _, enc = encoder
    got = enc.context(text)
    assert got.shape == (TEXT_LEN, 32) and not got.any()
    assert enc.context("x").any()                 # guard: one token is not all zeros


# -- upstream's own contexts -------------------------------------------------------------------
def case_names():
    return [c["name"] for c in json.loads(GOLDEN.read_text())["cases"]]


@pytest.mark.parametrize("name", case_names())
def test_context_matches_upstream(encoder, golden, name):
    _, enc = encoder
    case = next(c for c in golden["cases"] if c["name"] == name)
    text = case["prompt"] if case["seconds"] is None else positive_prompt(case["prompt"],
                                                                          case["seconds"])
    assert text == case["text"]
    assert enc.token_ids(text).tolist() == case["ids"]
    got = enc.context(text)
    kept, n = case["kept"], case["rows"]
    assert not got[n:].any()
    want = np.asarray(case["context"]).reshape(len(kept), got.shape[1])
    if kept:
        assert_close(got[kept], want, atol=UPSTREAM_ATOL, what=name)
    # guard: a prompt one word longer at the front moves every kept row (an empty one's row 0)
    other = enc.context("x " + text)
    rows = kept or [0]
    assert_differs(other[rows], want if kept else np.zeros_like(other[rows]),
                   atol=UPSTREAM_ATOL, what=f"{name} with a word more")
