"""Shared by the server tests and bench/serve_soak.py: uvicorn on loopback, a JSON client, the
tiny Nano and Realtime models behind it, and a stub model that a test holds and releases."""

import base64
import contextlib
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import soundfile as sf

from converters.codec import convert as convert_codec
from converters.nano import convert as convert_nano
from converters.realtime import convert as convert_realtime
from fixtures.make_codec import make_tiny_codec_gguf, make_tiny_nano_checkpoint
from fixtures.make_nano import make_tiny_nano_tts_checkpoint
from fixtures.make_realtime import make_tiny_realtime_checkpoint
from fixtures.make_spm import make_tiny_spm
from moss_tts.errors import InputError
from moss_tts.sampling import SamplingOptions
from moss_tts.server.connections import uvicorn_config
from moss_tts.server.settings import ServerSettings
from moss_tts.models.tts import CodecTTS
from moss_tts.models.tts import Reference

SR = 1600  # the tiny codec's rate


def settings(voices_root=None, **given) -> ServerSettings:
    """The server settings a test serves with: its voices under `voices_root`, and one stream
    a model unless it asks for more (create_app's default before issue 33 gave it settings;
    serve's default is auto)."""
    return ServerSettings(**{"voices_root": voices_root, "max_streams": 1} | given)


class Served:
    """uvicorn in a thread on an ephemeral loopback port, configured as `serve` runs it
    (connections.py, with `limits`); stopped at teardown. `sndbuf` sets the send buffer of the
    sockets it accepts (they inherit the listener's), so a client that stops reading fills it
    soon."""

    def __init__(self, app, limits=ServerSettings(), sndbuf=None):
        import uvicorn
        self.sock = socket.socket()
        if sndbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, limits))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def call(url, path, body=None, method=None, headers=None, data=None, timeout=60):
    """(status, lower-case headers, body bytes); a JSON body unless raw `data` is given."""
    if data is None and body is not None:
        data = json.dumps(body).encode()
    sent = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers=sent | (headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def client_of(server, timeout: float = 60):
    """The stock openai client of a served app (no retries: a test sees every answer)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=timeout)


def free_places(server, timeout: float = 60) -> int:
    """The first model's free places in its line now (/v1/models)."""
    status, _, body = call(server.url, "/v1/models", timeout=timeout)
    assert status == 200
    return json.loads(body)["data"][0]["free_places"]


def raw_post(port, body: dict, *, rcvbuf=None) -> socket.socket:
    """A POST sent over a bare socket whose reader we control (or never run)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (port, len(data), data))
    return sock


def sse_audio(body: bytes) -> bytes:
    """The audio of an SSE speech body: its delta events' bytes joined (where one event ends
    and the next begins is the stream's chunking, which may follow the clock)."""
    events = [json.loads(block[len(b"data: "):]) for block in body.split(b"\n\n") if block]
    assert events and events[-1]["type"] == "speech.audio.done", events[-1:]
    return b"".join(base64.b64decode(e["audio"]) for e in events[:-1])


def tiny_model_files(d, rate=SR):
    """(nano.gguf, codec.gguf) of the tiny fixture model at `rate`, converted under `d`."""
    codec_dir = make_tiny_nano_checkpoint(d / "codec", seed=1)
    if rate != SR:  # the codec's windows scale with the rate; the towers are unchanged
        config = json.loads((codec_dir / "config.json").read_text())
        config["sampling_rate"] = config["sample_rate"] = rate
        (codec_dir / "config.json").write_text(json.dumps(config))
    tts_dir = make_tiny_nano_tts_checkpoint(d / "tts", seed=0,
                                            tokenizer_model_bytes=make_tiny_spm(),
                                            audio_tokenizer_sample_rate=rate, stop_bias=-50)
    return convert_nano(tts_dir, d / "nano.gguf"), convert_codec(codec_dir, d / "codec.gguf")


def tiny_realtime_files(d):
    """(realtime.gguf, codec.gguf) of the tiny MOSS-TTS-Realtime model (3200 Hz mono), steered
    so that it speaks until its text is spent and then stops (fixtures.make_realtime)."""
    checkpoint = make_tiny_realtime_checkpoint(d / "rt", seed=0, steer=True)
    return (convert_realtime(str(checkpoint), d / "realtime.gguf", strict=True),
            make_tiny_codec_gguf(d / "v1", "v1"))


# How long a held stub waits for its test to let it go: only a broken test gets this far.
HOLD_GUARD_SECONDS = 60


class StubTTS:
    """Generation by the text: 'held' waits until the test sets `release`, then gives three
    chunks; 'endless' gives chunks until it is stopped (paced at 2 ms a chunk, so one that is
    never stopped ends after minutes, not out of memory); 'fail-early' / 'fail-late' raise
    before / after the first audio, 'bug' raises a non-package error; anything else gives three
    chunks. `started` is set when the first generation begins, `texts` lists what was spoken;
    with `hold_encode` a reference encode sets `encoding` and waits for `release` too."""

    sample_rate, channels, OPTIONS = SR, 2, SamplingOptions
    FAMILY = "nano"     # the registry row whose knobs a request may give it
    config = SimpleNamespace(n_vq=2)
    codec = SimpleNamespace(config=SimpleNamespace(variant="stub", codebook_size=4),
                            sample_rate=SR, n_quantizers=2)
    model = "stub"      # open: CodecTTS's checks below see a loaded model
    # stored voices as every model
    voice, _need_codec, _need_open = CodecTTS.voice, CodecTTS._need_codec, CodecTTS._need_open
    _reference, _check_voice_codec = CodecTTS._reference, CodecTTS._check_voice_codec
    WHOLE, whole_keywords = CodecTTS.WHOLE, CodecTTS.whole_keywords     # a whole response's
    BATCHED, LIVE = CodecTTS.BATCHED, CodecTTS.LIVE     # what a family declares by default

    def __init__(self, chunk_frames=32, hold_encode=False):
        self.chunk = np.full((chunk_frames, 2), 0.25, np.float32)
        self.hold_encode = hold_encode
        self.produced, self.texts, self.threads = [], [], set()
        self.started, self.encoding = threading.Event(), threading.Event()
        self.release, self.stopped = threading.Event(), threading.Event()

    def _wait_for_release(self, what):
        if not self.release.wait(HOLD_GUARD_SECONDS):
            raise RuntimeError(f"the test never released the held {what}")

    def stream(self, text, reference=None, **kwargs):
        self.threads.add(threading.current_thread().name)
        self.texts.append(text)
        self.started.set()
        if text == "fail-early":
            raise InputError("early failure")
        if text == "bug":
            raise RuntimeError("a bug")
        if text == "held":
            self._wait_for_release("generation")
        try:
            for i in range(100_000 if text == "endless" else 3):
                if text == "fail-late" and i == 2:
                    raise InputError("late failure")
                if text == "endless":
                    time.sleep(0.002)
                self.produced.append(i)
                yield self.chunk
        finally:
            self.stopped.set()

    def encode_reference(self, samples, rate):
        self.threads.add(threading.current_thread().name)
        if self.hold_encode:
            self.encoding.set()
            self._wait_for_release("reference encode")
        return Reference(np.zeros((4, 2), np.int32))


def silent_wav_b64(seconds=1.0):
    """A base64 WAV of silence at the tiny rate: real audio for upload paths."""
    buf = io.BytesIO()
    sf.write(buf, np.zeros((int(SR * seconds), 1), np.float32), SR, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


BOUND = 60     # seconds a waited-for state may take: only a broken server makes a test wait this


def until(condition, bound: float = BOUND) -> bool:
    """Whether `condition()` came true within `bound` seconds (checked every 10 ms)."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def read_to_end(sock: socket.socket, bound: float = BOUND) -> bytes:
    """All the socket gives until the server closes (or resets) it; a server that never does
    fails the test after `bound` seconds."""
    sock.settimeout(bound)
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@contextlib.contextmanager
def loaded_families(files: dict, kinds):
    """kind → its TTS (the family read from the GGUF `files[kind]`, with `files["codec"]`),
    closed when the block ends."""
    from moss_tts.models.registry import family_of_model

    made = {kind: family_of_model(files[kind]).tts_class().load(files[kind],
                                                                codec=files["codec"], threads=1)
            for kind in kinds}
    try:
        yield made
    finally:
        for tts in made.values():
            tts.close()
