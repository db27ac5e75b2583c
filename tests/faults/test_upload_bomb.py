"""Decompression bombs (issue 31, finding 4): a FLAC of silence that holds 100 M samples in
~300 KB, and small FLACs that declare 655 kHz or 8 channels, given to every surface that reads
audio: the server's `reference_audio`, a voice upload's `audio` and a TTSD speaker's
`reference_audio`; `tts --reference`, `--prompt-audio` and `--speaker`; `voice add`; a batch
line's `reference`. A voice is read to its first 30 s and no further (memory: tracemalloc's peak,
numpy's arrays included, against 30 s of the audio), a whole-file prompt past its bound and an
absurd header are refused in one line naming the field or flag and the bound, and the next
request is served as before."""

import base64
import contextlib
import io
import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_delay import make_tiny_published_models
from moss_tts.audio import PROMPT_MAX_SECONDS, REFERENCE_MAX_SECONDS, read_audio
from moss_tts.errors import InputError
from moss_tts.models.nano_tts import NanoTTS
from moss_tts.models.registry import family_of_model
from moss_tts.server import create_app
from moss_tts.server.request import RequestError, decode_upload
from moss_tts.voices import load_voice
from tests.server.helpers import Served, StubTTS, call, client_of, settings, tiny_model_files

RATE = 16000
BOMB_FRAMES = 96 * 2**20        # 100.7 M samples: 6291 s at 16 kHz in ~317 KB of FLAC
VOICE_BYTES = int(REFERENCE_MAX_SECONDS * RATE) * 4    # 30 s as float32 mono: what a voice uses
WHOLE_BYTES = BOMB_FRAMES * 4   # the whole decode, which the server made before (403 MB)
# the read keeps its 10 s blocks and their concatenation (2x); a server (with the stub model:
# no encode) adds the ~420 KB request body, on both ends, and its base64 text and bytes
READ_PEAK, SERVER_PEAK = 3 * VOICE_BYTES, 8 * VOICE_BYTES
# a bomb's request over an honest 30 s file's: its larger body, held a few times over (client,
# server, base64 text and bytes)
BODY_FACTOR = 8
SAFETY_NET = 300                # seconds: only a broken child process gets near it
SPEAK = {"seed": 1, "max_new_frames": 4}    # a short answer from the tiny Nano


def flac_of_silence(frames: int, rate: int = RATE, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    block = np.zeros((2**20, channels), np.int16)
    with sf.SoundFile(buf, "w", rate, channels, format="FLAC", subtype="PCM_16") as f:
        for start in range(0, frames, len(block)):
            f.write(block[:frames - start])
    return buf.getvalue()


def declaring(flac: bytes, frames: int) -> bytes:
    """The FLAC with STREAMINFO's 36-bit total-samples field set to `frames` (0: unknown), its
    audio untouched: a header that lies about the length."""
    head = int.from_bytes(flac[18:26], "big") & ~(2**36 - 1) | frames
    return flac[:18] + head.to_bytes(8, "big") + flac[26:]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@contextlib.contextmanager
def peak_memory():
    """`with peak_memory() as peak:` ... `peak()`: the most bytes Python and numpy held at once
    inside the block (every thread: the server's included)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    seen = {}
    try:
        yield lambda: seen["peak"]
    finally:
        seen["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@pytest.fixture(scope="module")
def bombs():
    assert len(flac := flac_of_silence(BOMB_FRAMES)) < 500_000
    return {"long": flac, "honest": flac_of_silence(int(REFERENCE_MAX_SECONDS * RATE)),
            "fast": flac_of_silence(31 * 655350, 655350),        # a rate no recording has
            "wide": flac_of_silence(31 * 48000, 48000, 8)}       # channels no codec takes


REFUSED = {"fast": "655350 Hz; audio is read at 1000 to 192000 Hz",
           "wide": "8 channels; every codec takes mono or stereo (at most 2)"}


def over_honest(send, bombs) -> tuple[int, object]:
    """(bytes the long bomb's peak lies above an honest 30 s file's, measured in one run on the
    same path once a first call built the model's graphs; what the bomb's call returned)."""
    send("warm", bombs["honest"])
    peaks, got = [], None
    for name in ("honest", "long"):
        with peak_memory() as peak:
            got = send(name, bombs[name])
        peaks.append(peak())
    assert peaks[1] < WHOLE_BYTES / 4, peaks
    return peaks[1] - peaks[0], got


# -- the one reader every surface uses ---------------------------------------------------------
def test_a_voice_is_read_to_30_seconds_whatever_the_file_holds(bombs):
    upload = b64(bombs["long"])
    with peak_memory() as peak:
        samples, rate = decode_upload(upload, "reference_audio")
    assert samples.shape == (REFERENCE_MAX_SECONDS * RATE, 1) and rate == RATE
    assert peak() < READ_PEAK < WHOLE_BYTES / 50, peak()
    with peak_memory() as peak:
        samples, _ = read_audio(io.BytesIO(bombs["long"]), max_seconds=REFERENCE_MAX_SECONDS)
    assert len(samples) == REFERENCE_MAX_SECONDS * RATE and peak() < READ_PEAK, peak()


def test_a_header_that_lies_is_read_no_further_than_the_bound(bombs):
    # says more than it holds (2^35 frames, 24 days): soundfile sized a whole read by it
    with peak_memory() as peak:
        samples, _ = decode_upload(b64(declaring(bombs["long"], 2**35)), "audio")
    assert len(samples) == REFERENCE_MAX_SECONDS * RATE and peak() < READ_PEAK, peak()
    # says less than it holds: read to what it says, for a voice and for a whole prompt
    for kw in ({"max_seconds": REFERENCE_MAX_SECONDS}, {"limit_seconds": PROMPT_MAX_SECONDS}):
        short = read_audio(io.BytesIO(declaring(bombs["long"], 1000)), **kw)[0]
        assert short.shape == (1000, 1)
    # says nothing (a FLAC written to a pipe): libsndfile cannot read it; refused unread
    with peak_memory() as peak, pytest.raises(RequestError) as e:
        decode_upload(b64(declaring(bombs["long"], 0)), "reference_audio")
    assert e.value.status == 400 and peak() < VOICE_BYTES
    assert "'reference_audio': its header does not say how long it is" in str(e.value)


def test_a_whole_file_past_its_bound_is_refused_before_it_is_decoded(bombs):
    with peak_memory() as peak, pytest.raises(InputError) as e:
        read_audio(io.BytesIO(bombs["long"]), limit_seconds=PROMPT_MAX_SECONDS,
                   name="--prompt-audio p.flac")
    assert peak() < VOICE_BYTES, peak()     # nothing decoded: the header said it all
    assert str(e.value).startswith("--prompt-audio p.flac is 6291.5 s long")
    assert f"the limit is {PROMPT_MAX_SECONDS:g} s" in str(e.value)


@pytest.mark.parametrize("bomb", sorted(REFUSED))
def test_an_absurd_header_is_refused_before_a_sample_is_decoded(bombs, bomb):
    for kw in ({"max_seconds": REFERENCE_MAX_SECONDS}, {"limit_seconds": PROMPT_MAX_SECONDS}):
        with peak_memory() as peak, pytest.raises(InputError) as e:
            read_audio(io.BytesIO(bombs[bomb]), name="ref", **kw)
        assert str(e.value).startswith("ref: its header declares") and REFUSED[bomb] in str(e.value)
        assert peak() < VOICE_BYTES, peak()


# -- the server: reference_audio, a voice upload's audio, a TTSD speaker's audio ---------------
class HeardStub(StubTTS):
    """The stub model of the server tests, noting the (frames, rate) of each reference it is
    given to encode: what the server decoded."""

    def __init__(self):
        super().__init__()
        self.heard = []

    def encode_reference(self, samples, rate):
        self.heard.append((len(samples), rate))
        return super().encode_reference(samples, rate)


@pytest.fixture(scope="module")
def stub_server(tmp_path_factory):
    stub = HeardStub()
    s = Served(create_app(stub, settings(tmp_path_factory.mktemp("stub") / "voices")))
    s.stub = stub
    yield s
    s.stop()


@pytest.fixture(scope="module")
def nano_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("bomb_server")
    model, codec = tiny_model_files(d)
    tts = NanoTTS.load(model, codec=codec, threads=1)
    s = Served(create_app(tts, settings(d / "voices")))
    yield s
    s.stop()
    tts.close()


def speak(client, **extra):
    return client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.",
                                      response_format="wav", extra_body=SPEAK | extra)


def still_serving(server, speak=speak):
    """Other requests are untouched: /health and an ordinary request answer as before."""
    assert call(server.url, "/health")[0] == 200
    audio, _ = sf.read(io.BytesIO(speak(client_of(server)).content))
    assert len(audio) > 0


def test_reference_audio_bomb_is_decoded_to_its_first_30_seconds(stub_server, bombs):
    client = client_of(stub_server)
    upload = b64(bombs["long"])
    with peak_memory() as peak:
        assert speak(client, reference_audio=upload).content[:4] == b"RIFF"
    assert stub_server.stub.heard[-1] == (REFERENCE_MAX_SECONDS * RATE, RATE)
    # the 30 s read, and the ~420 KB body a few times over (client, server, base64)
    assert peak() < SERVER_PEAK < WHOLE_BYTES / 25, peak()
    still_serving(stub_server)


def test_a_voice_upload_bomb_costs_what_30_seconds_cost(nano_server, bombs):
    def upload(name, data):
        status, _, body = call(nano_server.url, "/v1/audio/voices",
                               {"name": name, "audio": b64(data)})
        assert status == 201, body
        return json.loads(body)["frames"]
    extra, frames = over_honest(upload, bombs)
    # 30 s at the tiny codec's 1600 Hz, 32 samples a frame: the first 30 s and no more
    assert frames == REFERENCE_MAX_SECONDS * 1600 // 32
    assert extra < BODY_FACTOR * len(b64(bombs["long"])), extra
    still_serving(nano_server)


@pytest.mark.parametrize("bomb", sorted(REFUSED))
def test_an_absurd_upload_is_a_400_naming_its_field(nano_server, bombs, bomb):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        speak(client_of(nano_server), reference_audio=b64(bombs[bomb]))
    assert e.value.body["message"].startswith("'reference_audio': its header declares")
    assert REFUSED[bomb] in e.value.body["message"]
    status, _, body = call(nano_server.url, "/v1/audio/voices",
                           {"name": "absurd", "audio": b64(bombs[bomb])})
    message = json.loads(body)["error"]["message"]
    assert status == 400 and message.startswith("'audio': ") and REFUSED[bomb] in message
    still_serving(nano_server)


@pytest.fixture(scope="module")
def ttsd(tmp_path_factory):
    d = tmp_path_factory.mktemp("bomb_ttsd")
    files = make_tiny_published_models(d, ("ttsd",))
    tts = family_of_model(files["ttsd"]).tts_class().load(files["ttsd"], codec=files["codec"],
                                                           threads=1)
    yield {"dir": d, "tts": tts, **files}
    tts.close()


def test_a_ttsd_speakers_bomb_is_read_to_30_seconds_or_refused(ttsd, bombs):
    import openai

    def dialogue(client, speech: bytes | None = None):
        speakers = [{"reference_audio": b64(speech), "transcript": "Alice speaking."}] \
            if speech else None
        return client.audio.speech.create(
            model="tts-1", voice="alloy", input="[S1] Hello there.", response_format="wav",
            extra_body={"seed": 7, "max_new_rows": 8, "speakers": speakers})
    s = Served(create_app(ttsd["tts"], settings(ttsd["dir"] / "voices")))
    try:
        client = client_of(s)
        with peak_memory() as peak:     # cold (graphs built here): the bound is looser
            assert dialogue(client, bombs["long"]).content[:4] == b"RIFF"
        assert peak() < WHOLE_BYTES / 10, peak()
        with pytest.raises(openai.BadRequestError) as e:
            dialogue(client, bombs["wide"])
        assert e.value.body["message"].startswith("'speakers': its header declares 8 channels")
        still_serving(s, dialogue)
    finally:
        s.stop()


# -- the CLI, voice add and batch: the same reader, the flag or column named -------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory, bombs):
    d = tmp_path_factory.mktemp("bomb_files")
    model, codec = tiny_model_files(d)
    out = {"dir": d, "model": model, "codec": codec}
    for name, data in bombs.items():
        out[name] = d / f"{name}.flac"
        out[name].write_bytes(data)
    return out


def cli(*args, env=None):
    """`python -m moss_tts` from this checkout in a child process, with its own cache and
    voices (no user directory is touched)."""
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                          capture_output=True, text=True, timeout=SAFETY_NET,
                          env={**os.environ, "MOSS_TTS_THREADS": "1", **(env or {})})


def one_error_line(r) -> str:
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    return r.stderr.strip()


def tts(files, *args, env=None):
    return cli("tts", "--model", files["model"], "--codec", files["codec"], "--text", "Hi.",
               "--seed", 1, "--max-frames", 4, "-o", files["dir"] / "out.wav", *args,
               env={"MOSS_TTS_CACHE": str(files["dir"] / "cache")} | (env or {}))


def test_tts_reference_with_an_absurd_header_is_refused_naming_the_flag(files):
    for bomb, problem in REFUSED.items():
        line = one_error_line(tts(files, "--reference", files[bomb]))
        assert line.startswith(f"error: --reference {files[bomb]}: its header declares")
        assert problem in line
    assert tts(files).returncode == 0             # an ordinary run after them


def test_tts_prompt_audio_past_the_context_is_refused_in_one_line(files):
    line = one_error_line(tts(files, "--prompt-audio", files["long"], "--prompt-text", "Hi."))
    assert line == (f"error: --prompt-audio {files['long']} is 6291.5 s long; it is used "
                    f"whole, and the limit is {PROMPT_MAX_SECONDS:g} s — cut it")
    line = one_error_line(tts(files, "--prompt-audio", files["fast"], "--prompt-text", "Hi."))
    assert REFUSED["fast"] in line and "--prompt-audio" in line


def test_tts_speaker_bomb_is_refused_naming_the_flag(ttsd, files):
    r = cli("tts", "--model", ttsd["ttsd"], "--codec", ttsd["codec"], "--text", "[S1] Hi.",
            "--seed", 1, "--max-new-rows", 8, "-o", files["dir"] / "d.wav",
            "--speaker", f"1={files['wide']}:Alice speaking.",
            env={"MOSS_TTS_CACHE": str(files["dir"] / "cache")})
    line = one_error_line(r)
    assert line.startswith(f"error: --speaker {files['wide']}: ") and REFUSED["wide"] in line


def test_voice_add_stores_30_seconds_and_refuses_an_absurd_header(files):
    env = {"MOSS_TTS_VOICES": str(files["dir"] / "voices")}
    r = cli("voice", "add", "long", files["long"], "--codec", files["codec"], env=env)
    assert r.returncode == 0, r.stderr
    voice, _ = load_voice("long", root=files["dir"] / "voices")
    assert len(voice.codes) == REFERENCE_MAX_SECONDS * 1600 // 32    # the first 30 s, no more
    line = one_error_line(cli("voice", "add", "fast", files["fast"], "--codec", files["codec"],
                              env=env))
    assert line.startswith(f"error: {files['fast']}: its header declares 655350 Hz")
    with pytest.raises(InputError, match="no voice"):
        load_voice("fast", root=files["dir"] / "voices")


def test_a_batch_line_with_a_bomb_fails_alone(files):
    manifest = files["dir"] / "m.jsonl"
    rows = [{"id": "plain", "text": "Hello."},
            {"id": "wide", "text": "Hello.", "reference": str(files["wide"])},
            {"id": "after", "text": "Hello again."}]
    manifest.write_text("".join(json.dumps(r | {"max_frames": 4, "seed": 1}) + "\n"
                                for r in rows))
    out = files["dir"] / "batch"
    r = cli("batch", manifest, "--out", out, "--model", files["model"], "--codec",
            files["codec"], env={"MOSS_TTS_CACHE": str(files["dir"] / "cache")})
    assert r.returncode == 1 and "3 lines: 2 made, 0 already done, 1 failed" in r.stderr
    done = {x["id"]: x for x in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert [done[i]["status"] for i in ("plain", "after")] == ["ok"] * 2
    assert done["wide"]["error"].startswith(f"reference {files['wide']}: its header declares")
    assert REFUSED["wide"] in done["wide"]["error"]
