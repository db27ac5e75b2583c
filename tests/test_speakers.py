"""The `speakers` knob's shared form (moss_tts/speakers.py, declared in knobs.py): every surface
checks the same JSON list, names it as that surface spells it, and reads a stored voice's
transcript unless one is given (upstream's TTSD app needs each reference's words)."""

import numpy as np
import pytest

from moss_tts.errors import InputError
from moss_tts.knobs import BY_NAME, parse
from moss_tts.reference import Reference
from moss_tts.speakers import speakers_argument

KNOB = BY_NAME["speakers"]


def test_the_list_form_is_the_same_on_every_surface_with_its_own_source_word():
    given = [{"voice": "bob"}, None, {"reference": "a.wav", "transcript": "Hi."}]
    assert parse(KNOB, given, "manifest") == [
        {"voice": "bob", "transcript": None}, None, {"reference": "a.wav", "transcript": "Hi."}]
    assert parse(KNOB, '[{"voice": "bob", "transcript": "Yo."}]', "manifest") == [
        {"voice": "bob", "transcript": "Yo."}]                     # a CSV cell is JSON text
    assert parse(KNOB, [{"reference_audio": "QUJD", "transcript": "Hi."}], "request",
                 from_text=False) == [{"reference": "QUJD", "transcript": "Hi."}]
    with pytest.raises(InputError, match="unknown field 'reference'"):   # a request's word
        parse(KNOB, [{"reference": "a.wav", "transcript": "Hi."}], "request", from_text=False)


@pytest.mark.parametrize("value, message", [
    ({"voice": "bob"}, "must be a list"),
    ("[{", "must be a JSON list"),
    ([{"voice": "bob"}] * 6, "has 6 speakers; at most 5"),
    (["bob"], "speaker 1 must be an object"),
    ([{}], "speaker 1 needs one of voice"),
    ([{"voice": "bob", "reference": "a.wav"}], "not both"),
    ([None, {"reference": "a.wav"}], "speaker 2's reference needs its transcript"),
    ([{"voice": "bob", "transcript": " "}], "speaker 1's transcript must be the words"),
    ([{"voice": "bob", "transcript": "x" * 1025}], "at most 1024 characters"),
    ([{"voice": "../bob"}], "speaker 1: voice name '../bob' must be"),
    ([{"reference": 3, "transcript": "Hi."}], "speaker 1's reference must be a string"),
])
def test_a_bad_speakers_value_is_one_line_naming_the_column(value, message):
    with pytest.raises(InputError) as e:
        parse(KNOB, value, "manifest")
    assert str(e.value).startswith("speakers") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_entries_take_a_stored_voices_transcript_unless_one_is_given():
    codes = np.zeros((3, 2), np.int32)
    stored = {"bob": Reference(codes, name="bob", transcript="Stored words."),
              "eve": Reference(codes, name="eve")}
    specs = parse(KNOB, [{"voice": "bob"}, {"voice": "bob", "transcript": "Given."},
                         {"reference": "a.wav", "transcript": "Hi."}, None, {"voice": "eve"}],
                  "manifest")
    entries = speakers_argument(specs, voice=stored.__getitem__, speech=lambda p: ("read", p))
    assert entries == [(stored["bob"], "Stored words."), (stored["bob"], "Given."),
                       (("read", "a.wav"), "Hi."), None, (stored["eve"], None)]
