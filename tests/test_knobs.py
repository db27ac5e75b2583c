"""The knob table (moss_tts/knobs.py): one declaration per knob, the same checks through every
surface (CLI flags, server fields, manifest columns), bounds that are the options classes' and
the families' own (issue 22 findings 7, 8 and 10)."""

import re

import pytest

from moss_tts.errors import InputError
from moss_tts.knobs import (BY_NAME, KNOBS, SPELLINGS, parse, renamed, spelled,
                            synthesis_keywords, takes)
from moss_tts.models.registry import BY_KIND, FAMILIES


def test_every_knob_is_taken_by_some_family_and_spelled_once():
    for knob in KNOBS:
        assert any(takes(f, knob) for f in FAMILIES), knob.name
    assert len(SPELLINGS) == sum(1 + len(k.aliases) for k in KNOBS)


@pytest.mark.parametrize("surface, name", [("cli", "--top-k"), ("request", "'top_k'"),
                                           ("manifest", "top_k")])
def test_a_bad_value_names_the_knob_as_the_surface_spells_it(surface, name):
    with pytest.raises(InputError, match=f"^{name} must be a whole number"):
        parse(BY_NAME["top_k"], 2.5, surface)


def test_text_is_converted_only_where_values_arrive_as_text():
    assert parse(BY_NAME["temperature"], "0.5", "manifest") == 0.5
    with pytest.raises(InputError, match="must be a number, got a string"):
        parse(BY_NAME["temperature"], "0.5", "request", from_text=False)
    with pytest.raises(InputError, match="must be a finite number"):
        parse(BY_NAME["temperature"], float("nan"), "request")
    with pytest.raises(InputError, match="true or false"):
        parse(BY_NAME["greedy"], 1, "request", from_text=False)


def test_the_seed_is_bounded_to_numpys_range_on_every_surface():
    assert parse(BY_NAME["seed"], 2**32 - 1, "request") == 2**32 - 1
    for bad in (2**32, 1e30, -1):
        with pytest.raises(InputError, match="seed"):
            parse(BY_NAME["seed"], bad, "manifest")


def test_sampling_bounds_are_the_options_classes_own():
    """The server capped temperature at 10 while the dataclasses had no cap (finding 8): now a
    temperature the options class takes is taken everywhere, and one it refuses is refused,
    named as the surface names it."""
    nano = BY_KIND["nano"]
    words = synthesis_keywords(nano, {"temperature": 50.0}, "request")
    assert words["options"].audio_temperature == 50.0
    with pytest.raises(InputError, match="^--top-p must be in"):
        synthesis_keywords(nano, {"top_p": 1.5}, "cli")


@pytest.mark.parametrize("row", FAMILIES, ids=lambda f: f.kind)
def test_each_family_bounds_its_own_frame_budget(row):
    """The server bounded max_new_frames by Nano's 1000 for every family (finding 8); each
    family's limit is its own, checked before anything is loaded or reserved."""
    budget = row.tts_class().BUDGET
    knob = next(k for k in KNOBS if k.keyword == budget.keyword)
    words = synthesis_keywords(row, {knob.name: budget.limit}, "request")
    assert words[budget.keyword] == budget.limit
    with pytest.raises(InputError, match=f"'{knob.name}' must be at most {budget.limit} for"):
        synthesis_keywords(row, {knob.name: budget.limit + 1}, "request")


def test_a_knob_of_another_family_is_refused_by_its_spelling():
    with pytest.raises(InputError, match=r"^--max-new-rows is not a MOSS-TTS-Nano option"):
        synthesis_keywords(BY_KIND["nano"], {"max_new_rows": 5}, "cli")
    assert "instruction" not in synthesis_keywords(BY_KIND["nano"], {"instruction": "calm"},
                                                   "request", lenient=("instruction",))


def test_voice_clone_max_text_tokens_is_bounded_before_the_model_loads():
    """Finding 10: 251 was refused only after the model loaded; the bound is Nano's own."""
    limit = BY_KIND["nano"].tts_class().MAX_TEXT_TOKENS
    with pytest.raises(InputError, match=f"^--voice-clone-max-text-tokens must be at most "
                                         f"{limit}"):
        synthesis_keywords(BY_KIND["nano"], {"voice_clone_max_text_tokens": limit + 1}, "cli")


# greedy is a switch of the token samplers' options; a diffusion sampler has none
GREEDY = [f for f in FAMILIES if hasattr(f.options_class(), "greedy")]


def test_greedy_is_refused_where_nothing_is_drawn():
    assert [f.kind for f in FAMILIES if f not in GREEDY] == ["sfx-v2"]
    with pytest.raises(InputError, match=r"^--greedy is not a MOSS-SoundEffect-v2.0 option"):
        synthesis_keywords(BY_KIND["sfx-v2"], {"greedy": True}, "cli")


@pytest.mark.parametrize("row", GREEDY, ids=lambda f: f.kind)
def test_greedy_with_a_sampling_knob_is_one_error(row):
    """Finding 7: `--greedy --temperature 0.5` was accepted and the temperature ignored."""
    with pytest.raises(InputError, match=r"^--greedy takes no sampling knob: leave out "
                                         r"--temperature"):
        synthesis_keywords(row, {"greedy": True, "temperature": 0.5}, "cli")


@pytest.mark.parametrize("row", GREEDY, ids=lambda f: f.kind)
def test_greedy_is_the_options_classes_greedy(row):
    words = synthesis_keywords(row, {"greedy": True}, "manifest")
    assert words["options"] == row.options_class()().greedy()
    assert words["options"] != row.options_class()()


def test_an_api_error_is_renamed_to_the_flag():
    """Finding 10: `--n-vq 9` said "n_vq_for_inference must be ..."."""
    e = renamed(InputError("n_vq_for_inference must be a whole number in [1, 8], got 9"), "cli")
    assert str(e) == "--n-vq must be a whole number in [1, 8], got 9"
    e = renamed(InputError("audio_top_p must be in (0, 1], got 2"), "request")
    assert str(e) == "'top_p' must be in (0, 1], got 2"
    assert str(renamed(InputError("text is empty"), "cli")) == "text is empty"


def test_the_cli_flags_are_generated_from_the_table():
    from moss_tts.cli import build_parser
    sub = next(a for a in build_parser()._subparsers._group_actions)
    flags = {s for a in sub.choices["tts"]._actions for s in a.option_strings}
    for knob in KNOBS:
        assert knob.flag in flags
    ns = sub.choices["tts"].parse_args(["-o", "x.wav", "--top-k", "5", "--max-new-frames", "9"])
    assert ns.top_k == 5 and ns.max_frames == 9 and ns.temperature is None
    with pytest.raises(SystemExit):
        sub.choices["tts"].parse_args(["-o", "x.wav", "--top-k", "x"])


def test_help_states_each_familys_frame_budget_default(capsys):
    from moss_tts.cli import main
    with pytest.raises(SystemExit):
        main(["tts", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for row in FAMILIES:
        budget = row.tts_class().BUDGET
        assert f"{row.short} {budget.default}" in text, row.kind


@pytest.mark.parametrize("row", [f for f in FAMILIES if takes(f, BY_NAME["language"])],
                         ids=lambda f: f.kind)
def test_language_is_checked_against_the_familys_model_card_before_loading(row):
    """Every surface gets the card's name for a code, and one line in its own spelling of the
    knob for a language the family's card lacks (the class's LANGUAGES, text/languages.py)."""
    assert synthesis_keywords(row, {"language": " en "}, "cli")["language"] == "English"
    assert synthesis_keywords(row, {"language": "ENGLISH"}, "request")["language"] == "English"
    for surface, name in (("cli", "--language"), ("request", "'language'"),
                          ("manifest", "language")):
        with pytest.raises(InputError) as e:
            synthesis_keywords(row, {"language": "xx"}, surface)
        assert str(e.value).startswith(f"{name} 'xx' is not one of this model's ")
        assert "\n" not in str(e.value) and "English (en)" in str(e.value)


@pytest.mark.parametrize("surface, greedy", [("cli", "--greedy"), ("request", "'greedy'"),
                                             ("manifest", "greedy")])
@pytest.mark.parametrize("knob", ["temperature", "text_temperature"])
def test_a_zero_temperature_is_refused_alike_for_every_family(knob, surface, greedy):
    """Issue 31 (finding 10): `--temperature 0` was greedy for Delay, TTSD, VoiceGenerator,
    SoundEffect and Local, and an error for Nano, Local v1.5 and Realtime. One rule: a
    temperature is above 0 on every family and surface, and greedy is its own knob, which
    the error names as the surface spells it."""
    name = spelled(BY_NAME[knob], surface)
    with pytest.raises(InputError, match=f"^{re.escape(name)} must be finite and > 0, got 0 "
                                         rf"\(greedy decoding is the {greedy} switch"):
        parse(BY_NAME[knob], 0, surface, from_text=False)
    for row in FAMILIES:
        if takes(row, BY_NAME[knob]):
            with pytest.raises(InputError, match="greedy decoding is the"):
                synthesis_keywords(row, {knob: 0.0}, surface)
            words = synthesis_keywords(row, {"greedy": True}, surface)   # guard: the switch
            assert words["options"].is_greedy
