"""The model cards' languages (text/languages.py): every row accepted by name and by code, the
prompt value is the card's English name, anything else one line listing them."""

import pytest

from moss_tts.errors import InputError
from moss_tts.text.languages import LANGUAGES_V1, LANGUAGES_V15, language_name

# Upstream moss_tts_model_card.md (1.5 Supported Languages), transcribed (three per row).
V15_CARD = """
| Chinese | zh | Cantonese | yue | English | en |
| Arabic | ar | Czech | cs | Danish | da |
| Dutch | nl | Finnish | fi | French | fr |
| German | de | Greek | el | Hebrew | he |
| Hindi | hi | Hungarian | hu | Italian | it |
| Japanese | ja | Korean | ko | Macedonian | mk |
| Malay | ms | Persian (Farsi) | fa | Polish | pl |
| Portuguese | pt | Romanian | ro | Russian | ru |
| Spanish | es | Swahili | sw | Swedish | sv |
| Tagalog | tl | Thai | th | Turkish | tr |
| Vietnamese | vi |
"""
# moss_ttsd_model_card.md (1.5 Supported Languages: 19 rows under "20 languages"), and
# Hebrew: the v1.5 card keeps 1.0's 20 and adds 11 (V15_ADDED), and its 31 minus those 11 hold
# Hebrew too (docs/upstream-notes.md §family-7.2).
V1_CARD = """
| Chinese | zh | English | en | German | de |
| Spanish | es | French | fr | Japanese | ja |
| Italian | it | Hungarian | hu | Korean | ko |
| Russian | ru | Persian (Farsi) | fa | Arabic | ar |
| Polish | pl | Portuguese | pt | Czech | cs |
| Danish | da | Swedish | sv |
| Greek | el | Turkish | tr |
| Hebrew | he |
"""
V15_ADDED = {"Cantonese", "Dutch", "Finnish", "Hindi", "Macedonian", "Malay", "Romanian",
             "Swahili", "Tagalog", "Thai", "Vietnamese"}


def card_rows(table):
    cells = [c.strip() for line in table.strip().splitlines() for c in line.strip("|").split("|")]
    return list(zip(cells[::2], cells[1::2]))


V15_ROWS, V1_ROWS = card_rows(V15_CARD), card_rows(V1_CARD)


def test_tables_are_the_cards():
    assert len(V15_ROWS) == 31 and len(V1_ROWS) == 20
    assert set(LANGUAGES_V15) == set(V15_ROWS) and len(LANGUAGES_V15) == 31
    assert set(LANGUAGES_V1) == set(V1_ROWS) and len(LANGUAGES_V1) == 20
    assert {n for n, _ in V15_ROWS} - {n for n, _ in V1_ROWS} == V15_ADDED


@pytest.mark.parametrize("languages, rows", [(LANGUAGES_V15, V15_ROWS), (LANGUAGES_V1, V1_ROWS)],
                         ids=["v1.5", "v1"])
def test_every_row_is_accepted_by_name_and_by_code(languages, rows):
    for name, code in rows:
        for given in (name, code, name.upper(), code.upper(), f"  {name.lower()}\t", f" {code} "):
            assert language_name(given, languages) == name, given


@pytest.mark.parametrize("given", ["Persian", "farsi", "PERSIAN (FARSI)", "fa"])
def test_persian_by_either_of_its_names(given):
    assert language_name(given, LANGUAGES_V15) == "Persian (Farsi)"


@pytest.mark.parametrize("given", ["xx", "", "  ", "Klingon", "en-US", "English,", "(Farsi)x"])
def test_anything_else_is_one_line_naming_language_and_listing_them(given):
    with pytest.raises(InputError) as e:
        language_name(given, LANGUAGES_V15)
    message = str(e.value)
    assert message.startswith(f"language {given.strip()!r} is not one of") and "\n" not in message
    for name, code in V15_ROWS:
        assert f"{name} ({code})" in message


def test_a_v15_language_is_refused_by_the_v1_table():
    assert language_name("nl", LANGUAGES_V15) == "Dutch"
    with pytest.raises(InputError, match="not one of this model's 20 languages"):
        language_name("nl", LANGUAGES_V1)


@pytest.mark.parametrize("given", [None, 3, b"en"])
def test_a_language_that_is_not_a_str_is_refused(given):
    with pytest.raises(InputError, match="^language must be a str"):
        language_name(given, LANGUAGES_V15)
