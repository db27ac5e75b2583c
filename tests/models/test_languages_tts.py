"""The `language` prompt field on the tiny Delay, Local and Local v1.5 models: a name or code
of the family's LANGUAGES (the model card's table), written into the prompt as the card's
English name; None stays the word None; anything else is one line listing them."""

import pytest

from moss_tts.errors import InputError
from moss_tts.models.delay_tts import DelayTTS
from moss_tts.models.local_tts import LocalTTS
from moss_tts.models.local_v15_tts import LocalV15TTS
from moss_tts.text.delay_prompts import build_generation_rows
from tests.text.test_languages import V1_ROWS, V15_ROWS

from .conftest import THREADS

TEXT = "Bonjour à tous."


@pytest.fixture(scope="module")
def delay(delay_files):
    with DelayTTS.load(delay_files(4.0)[3], threads=THREADS) as tts:
        yield tts


def prompt_text(tts, rows) -> str:
    """The prompt's text channel, decoded (the tiny tokenizer.json spells each special)."""
    return tts.tokenizer.decode(rows[:, 0])


def test_delay_prompt_says_the_cards_name_for_a_name_or_a_code(delay):
    assert DelayTTS.LANGUAGES is LocalV15TTS.LANGUAGES and len(DelayTTS.LANGUAGES) == 31
    for name, code in V15_ROWS:
        want = build_generation_rows(delay.tokenizer, delay.ids, TEXT, language=name)
        assert f"- Language:\n{name}\n- Text:" in prompt_text(delay, want)
        for given in (name, code, f" {code.upper()} "):
            assert delay.plan(TEXT, language=given).tolist() == want.tolist(), given


def test_delay_prompt_without_a_language_says_none(delay):
    rows = delay.plan(TEXT)
    assert rows.tolist() == delay.plan(TEXT, language=None).tolist()
    assert "- Language:\nNone\n- Text:" in prompt_text(delay, rows)
    assert rows.tolist() != delay.plan(TEXT, language="fr").tolist()


@pytest.mark.parametrize("given", ["xx", "", "Klingon"])
def test_delay_refuses_another_language_in_one_line(delay, given):
    with pytest.raises(InputError) as e:
        delay.plan(TEXT, language=given)
    message = str(e.value)
    assert message.startswith("language ") and "\n" not in message
    assert all(f"{name} ({code})" in message for name, code in V15_ROWS)
    with pytest.raises(InputError, match="^language "):   # the streaming route checks it too
        list(delay.stream(TEXT, language=given, max_new_rows=2))


def test_local_v15_prompt_says_the_cards_name(local_v15_files):
    with LocalV15TTS.load(local_v15_files()[3], threads=THREADS) as tts:
        want = tts.plan(TEXT, language="Vietnamese")
        assert tts.plan(TEXT, language="vi").tolist() == want.tolist()
        assert "- Language:\nVietnamese\n- Text:" in prompt_text(tts, want)
        with pytest.raises(InputError, match="^language 'xx' is not one of this model's 31"):
            tts.plan(TEXT, language="xx")


def test_local_takes_the_20_languages_of_moss_tts_1_0(local_files):
    """The 1.7B Local model is a 1.0 release: v1.5's eleven new languages are refused."""
    assert {name for name, _ in LocalTTS.LANGUAGES} == {name for name, _ in V1_ROWS}
    with LocalTTS.load(local_files()[3], threads=THREADS) as tts:
        want = tts.plan(TEXT, language="German")
        assert tts.plan(TEXT, language="de").tolist() == want.tolist()
        assert "- Language:\nGerman\n- Text:" in prompt_text(tts, want)
        with pytest.raises(InputError, match="^language 'nl' is not one of this model's 20"):
            tts.plan(TEXT, language="nl")
