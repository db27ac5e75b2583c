"""The `speakers` knob (knobs.py declares it) as the front ends take it: one JSON form, checked
here for every surface — a list whose entry i is speaker i+1 (MOSS-TTSD's [S{i+1}]), each null
(no reference: the model picks that voice) or an object with one source, `{"voice": a stored
voice}` or `{SOURCE: reference speech}`, and its `"transcript"` (what the speech says; a stored
voice may bring its own). SOURCE is the surface's word for reference speech: a manifest's
`reference` (a file, relative to the manifest), a request's `reference_audio` (base64, as the
request's own field); the CLI builds the same list from its `--speaker N=SRC[:TRANSCRIPT]`
flags (cli/tts.py). Once the model is loaded, `speakers_argument` turns the list into the API's
(reference, transcript) pairs, each surface reading its speech its own way."""

from __future__ import annotations

import json

from .errors import InputError

SOURCES = {"cli": "reference", "manifest": "reference", "request": "reference_audio"}
MAX_TRANSCRIPT_CHARS = 1024     # the words of a few seconds of reference speech, not a text


def max_speakers() -> int:
    from .text.dialogue import MAX_SPEAKERS     # loaded when a dialogue is asked for

    return MAX_SPEAKERS


def speaker_specs(value, name: str, surface: str, *, from_text: bool = True) -> list:
    """A speakers value as JSON gives it (from_text: a JSON string, as a CSV cell holds it) →
    [None | {"voice": name} | {"reference": source}, each with "transcript" (None where not
    given)], sources under the common key "reference"; one InputError naming `name` else."""
    source = SOURCES[surface]
    form = (f'[{{"voice": NAME}} or {{"{source}": ..., "transcript": "what it says"}}, '
            "one per speaker, null for none]")
    if from_text and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InputError(f"{name} must be a JSON list {form}, got {value[:40]!r}") from None
    if not isinstance(value, list):
        raise InputError(f"{name} must be a list {form}, got {type(value).__name__}")
    if len(value) > max_speakers():
        raise InputError(f"{name} has {len(value)} speakers; at most {max_speakers()} "
                         f"([S1] … [S{max_speakers()}])")
    return [speaker_spec(entry, f"{name}: speaker {n}", source)
            for n, entry in enumerate(value, 1)]


def speaker_spec(entry, what: str, source: str) -> dict | None:
    """One speaker's entry (see speaker_specs); `what` names it in errors."""
    from .voices import check_name

    if entry is None:
        return None
    fields = ("voice", source, "transcript")
    if not isinstance(entry, dict):
        raise InputError(f"{what} must be an object with {' or '.join(fields[:2])} and "
                         f"transcript, or null; got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(fields))
    if unknown:
        raise InputError(f"{what} has unknown field {unknown[0]!r}; accepted: "
                         f"{', '.join(fields)}")
    given = [k for k in fields[:2] if entry.get(k) is not None]
    if len(given) != 1:
        raise InputError(f"{what} needs one of voice (a stored voice) or {source} (its speech), "
                         f"{'not both' if given else 'got neither'}")
    transcript = entry.get("transcript")
    if transcript is not None:
        if not isinstance(transcript, str) or not transcript.strip():
            raise InputError(f"{what}'s transcript must be the words its speech says, got "
                             f"{transcript!r}")
        if len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise InputError(f"{what}'s transcript must be at most {MAX_TRANSCRIPT_CHARS} "
                             f"characters, got {len(transcript)}")
    if given == ["voice"]:
        try:
            return {"voice": check_name(entry["voice"]), "transcript": transcript}
        except InputError as e:
            raise InputError(f"{what}: {e}") from None
    if not isinstance(entry[source], str) or not entry[source]:
        raise InputError(f"{what}'s {source} must be a string, got {entry[source]!r}")
    if transcript is None:     # upstream's TTSD continues from each reference's words
        raise InputError(f"{what}'s {source} needs its transcript (what the speech says)")
    return {"reference": entry[source], "transcript": transcript}


def speakers_argument(specs: list, *, voice, speech) -> list:
    """Checked specs → the API's `speakers`: per speaker None or (reference, transcript), a
    stored voice (`voice(name)` → Reference) bringing its stored transcript unless one is
    given, reference speech read by `speech(source)` → (samples, sample_rate)."""
    out = []
    for spec in specs:
        if spec is None:
            out.append(None)
        elif "voice" in spec:
            reference = voice(spec["voice"])
            out.append((reference, spec["transcript"] or reference.transcript))
        else:
            out.append((speech(spec["reference"]), spec["transcript"]))
    return out
