"""Every capped field a client controls, on every surface (issue 31, finding 7): the Python API
(`synthesize`), the `tts` flag, the server's request field (the stock `openai` client) and the
batch manifest's column each refuse a value past the field's bound with the same limit, in one
line naming the field as that surface spells it. The bounds are the knob table's and the
families' own declarations (MOSS-SoundEffect's description, MAX_PROMPT_CHARS, the frame
budget a duration must fit, the seed's range), read here from those declarations. Tiny
MOSS-VoiceGenerator, MOSS-SoundEffect and MOSS-TTSD through the real converter."""

import re
from dataclasses import dataclass

import openai
import pytest

from fixtures.make_delay import make_tiny_published_models
from moss_tts.batch import run_batch
from moss_tts.cli import main
from moss_tts.errors import InputError
from moss_tts.knobs import MAX_PROMPT_CHARS, SEED_LIMIT
from moss_tts.models.registry import BY_KIND
from moss_tts.server import create_app
from moss_tts.speakers import MAX_TRANSCRIPT_CHARS
from tests.batch.conftest import records, write_jsonl
from tests.server.helpers import call, client_of, loaded_families, settings

ROWS = 20          # the tiny models rarely end by themselves: a value that slips through is cheap
KINDS = ("voicegen", "sfx", "ttsd")
SFX = BY_KIND["sfx"].tts_class()
DESCRIPTION = SFX.MAX_TEXT_CHARS                          # MOSS-SoundEffect's, declared once
MOST_SECONDS = SFX.BUDGET.limit / SFX.FRAME_RATE          # what its frame budget can make
SURFACES = ("api", "cli", "request", "manifest")


@dataclass(frozen=True)
class Case:
    """A field past its bound: the model kind, the field (its `stream` keyword, or `text`),
    the value, the limit every surface must state, and the field's name on each surface."""

    kind: str
    field: str
    value: object
    limit: str
    names: tuple          # api, cli, request, manifest

    def keywords(self) -> dict:
        """The request: what the kind needs to speak, and the field past its bound."""
        base = {"sfx": {"sound": "Rain on a tin roof."},
                "voicegen": {"text": "Hello there.", "instruction": "A calm, low voice."}}
        kw = dict(base[self.kind], seed=7)
        if self.field == "text":
            kw.pop("sound", None)
        return kw | {self.field: self.value}


CASES = {
    "sfx-text": Case("sfx", "text", "rain." * 205, str(DESCRIPTION),
                     ("text", "--text", "'input'", "text")),
    "sfx-sound": Case("sfx", "sound", "rain." * 205, str(DESCRIPTION),
                      ("sound", "--sound", "'sound'", "sound")),
    "voicegen-instruction": Case("voicegen", "instruction", "calm." * 205, str(MAX_PROMPT_CHARS),
                                 ("instruction", "--instruction", "'instructions'",
                                  "instruction")),
    "voicegen-language": Case("voicegen", "language", "e" * (MAX_PROMPT_CHARS + 1),
                              str(MAX_PROMPT_CHARS),
                              ("language", "--language", "'language'", "language")),
    "sfx-seconds": Case("sfx", "seconds", 1e300, f"{MOST_SECONDS:g}",
                        ("seconds", "--seconds", "'seconds'", "seconds")),
    "sfx-tokens": Case("sfx", "tokens", 10**23, str(SFX.BUDGET.limit),
                       ("tokens", "--tokens", "'tokens'", "tokens")),
    "sfx-seed": Case("sfx", "seed", 2**40, str(SEED_LIMIT - 1),
                     ("seed", "--seed", "'seed'", "seed")),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    made = make_tiny_published_models(tmp_path_factory.mktemp("bounds"), KINDS)
    return {key: str(path) for key, path in made.items()}


@pytest.fixture(scope="module")
def models(files):
    with loaded_families(files, KINDS) as made:
        yield made


@pytest.fixture
def server(models, served, tmp_path):
    return served(create_app(dict(models), settings(tmp_path / "voices")))


def assert_states_the_bound(message: str, name: str, limit: str) -> None:
    """One line that names the field and states the limit (`NAME must be at most LIMIT`; the
    CLI's argparse says `argument NAME/ALIAS: must be ...`)."""
    assert "\n" not in message.strip(), message
    assert re.search(rf"{re.escape(name)}(/--[\w-]+)?:? must be at most {re.escape(limit)}\b",
                     message), \
        (name, limit, message)


def refused_by_api(models, case: Case) -> str:
    kw = case.keywords()
    with pytest.raises(InputError) as e:
        models[case.kind].synthesize(kw.pop("text", None), max_new_rows=ROWS, **kw)
    return str(e.value)


def refused_by_cli(files, case: Case, tmp_path, capsys) -> str:
    flags = []
    for field, value in case.keywords().items():
        flags += [f"--{field.replace('_', '-')}", str(value)]
    out = tmp_path / "out.wav"
    try:
        code = main(["tts", "--model", files[case.kind], "--codec", files["codec"],
                     "--max-new-rows", str(ROWS), "--threads", "1", "-o", str(out), *flags])
    except SystemExit as e:       # argparse refuses a flag's value itself (exit 2)
        code = e.code
    assert code != 0 and not out.exists()
    return capsys.readouterr().err


def refused_by_server(server, case: Case) -> str:
    """Through the stock openai client: `input` and `instructions` are its own parameters."""
    kw = case.keywords()
    text, instructions = kw.pop("text", None), kw.pop("instruction", None)
    extra = {"max_new_rows": ROWS} | kw
    if text is None:     # a sound described by `sound` alone: a body the client cannot send
        status, _, body = call(server.url, "/v1/audio/speech",
                               {"model": case.kind, "response_format": "wav", **extra})
        assert status == 400, body
        return openai_message(body)
    with pytest.raises(openai.BadRequestError) as e:
        client_of(server).audio.speech.create(
            model=case.kind, voice="alloy", input=text, response_format="wav",
            **({"instructions": instructions} if instructions else {}), extra_body=extra)
    return e.value.body["message"]


def openai_message(body: bytes) -> str:
    import json

    return json.loads(body)["error"]["message"]


@pytest.mark.parametrize("surface", ["api", "cli", "request"])
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_each_capped_field_is_refused_alike_on_each_surface(case, surface, files, models,
                                                            request, tmp_path, capsys):
    c = CASES[case]
    if surface == "api":
        message = refused_by_api(models, c)
    elif surface == "cli":
        message = refused_by_cli(files, c, tmp_path, capsys)
    else:
        message = refused_by_server(request.getfixturevalue("server"), c)
    assert_states_the_bound(message, c.names[SURFACES.index(surface)], c.limit)


def test_each_capped_column_fails_its_line_alike(files, tmp_path):
    """The manifest surface, one run for every case (a bad line fails alone, naming its
    column); a line within the bounds runs beside them (guard)."""
    rows = [{"id": "fine", "model": files["sfx"], "sound": "Rain.", "seed": 7}]
    for name, c in CASES.items():
        kw = c.keywords()
        rows.append({"id": name, "model": files[c.kind], **kw})
    manifest = write_jsonl(tmp_path / "m.jsonl", [r | {"max_new_rows": ROWS} for r in rows])
    run_batch(manifest, tmp_path / "out", model=files["sfx"], codec=files["codec"], threads=1)
    done = {r["id"]: r for r in records(tmp_path / "out")}
    assert done["fine"]["status"] == "ok"
    for name, c in CASES.items():
        assert done[name]["status"] == "failed", name
        assert_states_the_bound(done[name]["error"], c.names[SURFACES.index("manifest")], c.limit)


def test_an_over_long_sound_effect_text_is_refused_before_any_model_work(files, tmp_path,
                                                                         capsys, monkeypatch):
    """`tts --text` / `--text-file` to MOSS-SoundEffect (the description as the text) was not
    bounded at all (only --sound was): refused now before the model is even loaded."""
    loads = []

    def load(cls, *args, **kwargs):
        loads.append(args)
        raise InputError("the model was loaded")

    monkeypatch.setattr(SFX, "load", classmethod(load))
    long = "rain." * 205
    (tmp_path / "sound.txt").write_text(long)
    for flags, name in ((["--text", long], "--text"),
                        (["--text-file", str(tmp_path / "sound.txt")], "--text-file")):
        code = main(["tts", "--model", files["sfx"], "--codec", files["codec"],
                     "-o", str(tmp_path / "o.wav"), *flags])
        err = capsys.readouterr().err
        assert code == 1
        assert err == (f"error: {name} must be at most {DESCRIPTION} characters for "
                       f"MOSS-SoundEffect, got {len(long)}\n")
    assert loads == []
    # guard: a description within the bound gets as far as loading the model
    main(["tts", "--model", files["sfx"], "--codec", files["codec"], "-o",
          str(tmp_path / "o.wav"), "--text", "rain"])
    assert capsys.readouterr().err == "error: the model was loaded\n"
    assert len(loads) == 1


@pytest.mark.parametrize("field, value", [("seconds", 1e300), ("tokens", 1e23),
                                          ("seconds", 1e308)])
def test_a_huge_duration_is_a_400_on_the_server(field, value, server):
    """`seconds` 1e300 and `tokens` 1e23 were accepted (and 1e308 seconds overflowed to a
    500): each is a 400 naming the field and the duration the model can make, before any
    model work."""
    status, _, body = call(server.url, "/v1/audio/speech",
                           {"model": "sfx", "sound": "Rain.", field: value,
                            "response_format": "wav", "max_new_rows": ROWS})
    assert status == 400
    limit = f"{MOST_SECONDS:g}" if field == "seconds" else str(SFX.BUDGET.limit)
    assert_states_the_bound(openai_message(body), f"'{field}'", limit)


def test_a_speakers_transcript_is_bounded_in_the_api_as_on_every_front_end(models):
    """The front ends bounded a MOSS-TTSD speaker's transcript (speakers.py); the API took any
    length."""
    speech = models["ttsd"].encode_reference(*_tone())
    with pytest.raises(InputError, match=rf"transcript must be at most {MAX_TRANSCRIPT_CHARS} "):
        models["ttsd"].synthesize("[S1] Hello.", speakers=[(speech, "word." * 205)], seed=7,
                                  max_new_rows=ROWS)
    # guard: the same speaker with a short transcript speaks
    audio, _ = models["ttsd"].synthesize("[S1] Hello.", speakers=[(speech, "Hi there.")],
                                         seed=7, max_new_rows=ROWS)
    assert len(audio)


def _tone():
    import numpy as np

    from fixtures.make_delay import SAMPLE_RATE

    t = np.arange(int(0.5 * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), SAMPLE_RATE
