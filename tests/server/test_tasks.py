"""The server over MossTTSDelay's other published checkpoints (tiny MOSS-TTSD,
MOSS-VoiceGenerator and MOSS-SoundEffect through the real converter), with the stock `openai`
client: OpenAI's `instructions` is the designed voice, `input` the sound's description, the
`speakers` extension field the dialogue's voices (stored by name, or uploaded with their
transcripts); each answer equals the API's audio for the same seed, and each bad field is a
400 naming it."""

import base64
import io
import json

import numpy as np
import openai
import pytest
import soundfile as sf

from fixtures.make_delay import SAMPLE_RATE, make_tiny_published_models
from moss_tts.server import create_app
from moss_tts.voices import add_voice
from tests.server.helpers import call, loaded_families, settings

ROWS = 20          # the tiny models rarely end by themselves: rows are capped
DIALOGUE = "[S1] Hello there. [S2] Fine, thanks."
KINDS = ("ttsd", "voicegen", "sfx")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("server_tasks")
    out = {"dir": d, **make_tiny_published_models(d, KINDS)}
    t = np.arange(int(0.5 * SAMPLE_RATE)) / SAMPLE_RATE
    out["alice"] = d / "alice.wav"
    sf.write(out["alice"], (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), SAMPLE_RATE)
    rng = np.random.default_rng(4)
    add_voice("bob", rng.integers(0, 64, size=(6, 8)), {"transcript": "Bob speaking."},
              root=d / "voices")
    add_voice("mute", rng.integers(0, 64, size=(6, 8)), {}, root=d / "voices")
    return out


@pytest.fixture(scope="module")
def models(files):
    with loaded_families(files, KINDS) as made:
        yield made


@pytest.fixture
def server(files, models, served):
    s = served(create_app(dict(models), settings(files["dir"] / "voices")))
    return s, openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)


def speech(client, model, text, **extra):
    r = client.audio.speech.create(model=model, voice="alloy", input=text, response_format="wav",
                                   extra_body={"seed": 7, "max_new_rows": ROWS} | extra)
    return sf.read(io.BytesIO(r.content), dtype="float32", always_2d=True)[0]


def api(models, kind, *args, **kw):
    return models[kind].synthesize(*args, seed=7, max_new_rows=ROWS, **kw)[0]


def refused(client, model, text, **extra) -> str:
    with pytest.raises(openai.BadRequestError) as e:
        speech(client, model, text, **extra)
    message = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value)
    assert "\n" not in message
    return message


def test_openai_instructions_design_the_voice(server, models):
    _, client = server
    r = client.audio.speech.create(model="voicegen", voice="alloy", input="Hello there.",
                                   instructions="A calm, low voice.", response_format="wav",
                                   extra_body={"seed": 7, "max_new_rows": ROWS})
    audio = sf.read(io.BytesIO(r.content), dtype="float32", always_2d=True)[0]
    np.testing.assert_array_equal(audio, api(models, "voicegen", "Hello there.",
                                             instruction="A calm, low voice."))


def test_the_input_is_the_sound_and_a_sound_field_needs_no_input(server, models):
    s, client = server
    want = api(models, "sfx", None, sound="Rain on a tin roof.", seconds=1)
    np.testing.assert_array_equal(speech(client, "sfx", "Rain on a tin roof.", seconds=1), want)
    status, _, body = call(s.url, "/v1/audio/speech", {
        "model": "sfx", "sound": "Rain on a tin roof.", "seconds": 1, "seed": 7,
        "max_new_rows": ROWS, "response_format": "wav"})
    assert status == 200, body
    np.testing.assert_array_equal(sf.read(io.BytesIO(body), dtype="float32",
                                          always_2d=True)[0], want)


def test_speakers_by_stored_voice_and_by_upload_with_its_transcript(server, models, files):
    _, client = server
    upload = base64.b64encode(files["alice"].read_bytes()).decode()
    audio = speech(client, "ttsd", DIALOGUE, speakers=[
        {"reference_audio": upload, "transcript": "Alice speaking."}, {"voice": "bob"}])
    alice = sf.read(files["alice"], dtype="float32", always_2d=True)
    tts = models["ttsd"]
    want = api(models, "ttsd", DIALOGUE, speakers=[
        (alice, "Alice speaking."), tts.voice("bob", root=files["dir"] / "voices")])
    np.testing.assert_array_equal(audio, want)
    # a stored voice with a transcript given: that transcript, not the stored one
    audio = speech(client, "ttsd", DIALOGUE, speakers=[
        {"voice": "mute", "transcript": "Words."}, None])
    ref = tts.voice("mute", root=files["dir"] / "voices")
    np.testing.assert_array_equal(audio, api(models, "ttsd", DIALOGUE,
                                             speakers=[(ref, "Words."), None]))


def test_a_speaker_given_no_voice_is_the_models_choice(server, models, files):
    """Upstream's TTSD app clones S1 and leaves S2 to the model: `speakers` naming S1 only,
    with [S2] in the dialogue, speaks as the API does with [S1's voice, None]."""
    _, client = server
    bob = models["ttsd"].voice("bob", root=files["dir"] / "voices")
    want = api(models, "ttsd", DIALOGUE, speakers=[bob, None])
    np.testing.assert_array_equal(speech(client, "ttsd", DIALOGUE, speakers=[{"voice": "bob"}]),
                                  want)


@pytest.mark.parametrize("model, extra, message", [
    ("voicegen", {}, "'instruction' (or 'instructions') is required for MOSS-VoiceGenerator"),
    ("ttsd", {"speakers": {"voice": "bob"}}, "'speakers' must be a list"),
    ("ttsd", {"speakers": [{"voice": "bob", "audio": "x"}]},
     "'speakers': speaker 1 has unknown field 'audio'"),
    ("ttsd", {"speakers": [{"reference_audio": "AAAA"}]},
     "'speakers': speaker 1's reference_audio needs its transcript"),
    ("ttsd", {"speakers": [{"voice": "bob"}] * 6}, "'speakers' has 6 speakers; at most 5"),
    ("ttsd", {"speakers": [{"voice": "nobody"}]}, "'speakers': no stored voice named 'nobody'"),
    ("ttsd", {"speakers": [{"voice": "mute"}]},
     "'speakers': speaker 1 has reference speech but no transcript"),
    ("voicegen", {"speakers": [{"voice": "bob"}], "instructions": "Calm."},
     "'speakers' is not a MOSS-VoiceGenerator option"),
    ("sfx", {"reference_audio": "AAAA"}, "'reference_audio' is not a MOSS-SoundEffect option"),
    ("ttsd", {"voice": "bob"}, "'voice' 'bob' is not a MOSS-TTSD v1.0 option: give "
                               "each speaker's voice in 'speakers'"),
])
def test_a_bad_task_field_is_a_400_naming_it(server, model, extra, message):
    """... by its request field: never a CLI flag (`--speaker`), as the model's own checks
    say it to the CLI."""
    s, _ = server
    body = {"model": model, "input": DIALOGUE, "seed": 7, "max_new_rows": ROWS,
            "response_format": "wav"} | extra
    status, _, answer = call(s.url, "/v1/audio/speech", body)
    text = json.loads(answer)["error"]["message"]
    assert status == 400 and "\n" not in text and "--" not in text, text
    assert message in text


def test_the_openai_client_sees_the_400(server):
    _, client = server
    assert "'instructions'" in refused(client, "voicegen", "Hello.")
