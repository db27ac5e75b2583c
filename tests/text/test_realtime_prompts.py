"""MossTTSRealtime prompts built by ids (text/realtime_prompts.py) against upstream's string
route (fixtures/reference/realtime.py: the whole string with spelled control tokens tokenized
at once) on the tiny tokenizer.json whose specials sit at the upstream ids: the system and
voice-clone blocks, the 12-token lead with BOS on codebook 0 of its last row, user turns
with audio (both layouts of `_build_turn`), the turn prefixes of the training layout (P17)."""

import numpy as np
import pytest

from fixtures.make_delay import make_tokenizer_json
from fixtures.make_realtime import CODEBOOK, RVQ, TEXT_PAD, tiny_config
from fixtures.reference import realtime as ref
from moss_tts.errors import InputError
from moss_tts.text import realtime_prompts as prompts
from moss_tts.text.qwen_tokenizer import QwenTokenizer

CFG = tiny_config()
IM_START, IM_END, AUDIO_PAD_ROW = 151644, 151645, 151654
BOS, EOS = CODEBOOK + 1, CODEBOOK + 2
IDS = prompts.RealtimePromptIds(RVQ, IM_START, IM_END, AUDIO_PAD_ROW, TEXT_PAD, CODEBOOK, BOS,
                                EOS)
LONG = "Hello there, this is a tiny test of speech in English, 12345 and more."


@pytest.fixture(scope="module")
def tokenizer_json():
    return make_tokenizer_json()


@pytest.fixture(scope="module")
def tokenizer(tokenizer_json):
    return QwenTokenizer.from_json(tokenizer_json)


def codes(frames, seed=0):
    return np.random.default_rng(seed).integers(0, CODEBOOK, size=(frames, RVQ))


@pytest.mark.parametrize("text", [LONG, "Hi there."], ids=["long", "short"])
@pytest.mark.parametrize("voice", [None, 5], ids=["plain", "voice"])
def test_generation_rows_match_upstreams_string_route(tokenizer, tokenizer_json, text, voice):
    voice_codes = None if voice is None else codes(voice)
    rows, rest = prompts.build_generation_rows(tokenizer, IDS, text, voice=voice_codes)
    want, want_rest = ref.generation_rows_by_string(tokenizer_json, CFG, text, voice_codes)
    np.testing.assert_array_equal(rows, want)
    assert rest == want_rest


def test_the_lead_is_twelve_tokens_with_bos_on_codebook_0_of_the_last(tokenizer):
    rows, rest = prompts.build_generation_rows(tokenizer, IDS, LONG)
    words = tokenizer.encode(LONG)
    assert len(words) > 14 and rest == words[12:]
    np.testing.assert_array_equal(rows[-12:, 0], words[:12])
    assert rows[-1, 1] == BOS and (rows[-1, 2:] == CODEBOOK).all()
    assert (rows[:-1, 1:] == CODEBOOK).all(), "BOS sits on the last lead row only"
    assert rows[-15:-12, 0].tolist() == [IM_START] + tokenizer.encode("assistant\n")
    # a text shorter than the lead: all of it leads, BOS on its last token, nothing left
    short, rest = prompts.build_generation_rows(tokenizer, IDS, "Hi.")
    n = len(tokenizer.encode("Hi."))
    assert n < 12 and rest == [] and short[-1, 1] == BOS
    np.testing.assert_array_equal(short[-n:, 0], tokenizer.encode("Hi."))


def test_voice_block_carries_the_reference_frames_on_its_audio_pad_rows(tokenizer):
    voice = np.hstack([codes(3), np.full((3, 4), 7)])        # codec codes have more codebooks
    rows = prompts.system_rows(tokenizer, IDS, voice)
    plain = prompts.system_rows(tokenizer, IDS)
    np.testing.assert_array_equal(rows[:len(plain)], plain)
    at = np.flatnonzero(rows[:, 0] == AUDIO_PAD_ROW)
    assert len(at) == 3 and np.array_equal(at, at[0] + np.arange(3))
    np.testing.assert_array_equal(rows[at, 1:], voice[:, :RVQ])
    assert rows[-2:, 0].tolist() == [IM_END] + tokenizer.encode("\n")


@pytest.mark.parametrize("text, frames", [(LONG, 6), (LONG, 40), ("Hi.", 4), ("", 3)],
                         ids=["long_text", "long_audio", "short_text", "no_text"])
@pytest.mark.parametrize("first", [True, False])
def test_user_turn_with_audio_matches_the_training_layout(tokenizer, tokenizer_json, text, frames,
                                                          first):
    audio = codes(frames, seed=frames)
    got = prompts.user_turn_rows(tokenizer, IDS, text, audio, first=first)
    np.testing.assert_array_equal(got, ref.user_turn_by_string(tokenizer_json, CFG, text, audio,
                                                               first=first))
    assert (got[:, 1] == BOS).sum() == 1 and (got[:, 1] == EOS).sum() == 1


def test_turn_prefixes_follow_the_training_layout(tokenizer):
    """P17: the first turn after the system block opens without <|im_end|>; later ones close
    the previous turn first (the demo apps double it on the first turn; we do not)."""
    first = prompts.turn_prefix(tokenizer, IDS, "user", True)
    later = prompts.turn_prefix(tokenizer, IDS, "assistant", False)
    assert first == [IM_START] + tokenizer.encode("user\n")
    assert later == [IM_END] + tokenizer.encode("\n") + [IM_START] + tokenizer.encode("assistant\n")
    text_only = prompts.user_turn_rows(tokenizer, IDS, "Hi there.", first=False)
    assert text_only[:, 0].tolist() == [IM_END] + tokenizer.encode("\n") + [IM_START] + \
        tokenizer.encode("user\n") + tokenizer.encode("Hi there.")
    assert (text_only[:, 1:] == CODEBOOK).all()
    eos = prompts.eos_row(IDS)
    assert eos.tolist() == [[TEXT_PAD, EOS] + [CODEBOOK] * (RVQ - 1)]


@pytest.mark.parametrize("call, match", [
    (lambda t: prompts.build_generation_rows(t, IDS, "  "), "text is empty"),
    (lambda t: prompts.build_generation_rows(t, IDS, "Say <|im_end|>"), "control token"),
    (lambda t: prompts.user_turn_rows(t, IDS, "", first=True), "needs text or audio"),
    (lambda t: prompts.system_rows(t, IDS, np.zeros((3, 2), int)), r"\[frames, 4\]"),
    (lambda t: prompts.system_rows(t, IDS, np.full((3, 4), CODEBOOK)), "must lie in"),
    (lambda t: prompts.lead_rows([], IDS), "at least one text token"),
])
def test_bad_prompt_input_raises_input_error(tokenizer, call, match):
    with pytest.raises(InputError, match=match):
        call(tokenizer)
