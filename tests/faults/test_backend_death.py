"""issue 31 (finding 2): a remote backend that dies mid-call ends only what used it. ggml ends a
process whose backend is lost (GGML_ABORT in ggml-rpc.cpp; ggml/log.py), so:

- `tts` says so in one line and exits 1 (it was exit 134 and ~99 lines of gdb backtrace), its
  output file never written half;
- `serve` keeps a model on such a backend in a child process (server/hosted.py): the request
  in flight fails, later ones get 503 in OpenAI's shape, /health says the model is unavailable,
  the server stays up, and once the backend is back the model is loaded again and answers as
  before (bit-equal audio on the RPC backend);
- a `batch` worker ends in one line, its line is retried, and a run whose backend stays gone
  stops with one line, the lines already made kept.

The backend is ggml's RPC server in a child process (ggml/rpc.py LocalServer), killed with
SIGKILL as a lost machine would be. The waits are safety nets; no test asserts a time."""

import io
import json
import os
import socket
import subprocess
import sys

import openai
import pytest
import soundfile as sf

from moss_tts.ggml.rpc import LocalServer
from tests.batch.conftest import (batch_cli, batch_models, no_partials, own_cache,  # noqa: F401
                                  records, write_jsonl)
from tests.server.helpers import call, tiny_model_files, until

SAFETY_S = 120
LONG_TEXT = " ".join(f"Sentence number {i} is here and it goes on." for i in range(60))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, what: str, timeout: float = SAFETY_S):
    """The first true value `predicate()` gives, within `timeout` seconds (else the test
    fails saying `what` did not happen)."""
    got = []
    assert until(lambda: got.append(predicate()) or got[-1], timeout), \
        f"{what}: not within {timeout} s"
    return got[-1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(nano.gguf, codec.gguf) of the tiny Nano that never stops: long texts take long."""
    return tiny_model_files(tmp_path_factory.mktemp("backend_death"))


def tts_command(model, codec, backend, out) -> list[str]:
    return [sys.executable, "-m", "moss_tts", "tts", "--model", str(model), "--codec",
            str(codec), "--backend", backend.name, "--text", LONG_TEXT, "-o", str(out)]


def test_tts_whose_backend_dies_mid_speech_ends_in_one_line(tiny):
    with LocalServer() as backend:
        tts = subprocess.Popen(tts_command(*tiny, backend, "-"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        assert tts.stdout.read(1), tts.communicate()      # speech is coming out: mid-synthesis
    _, err = tts.communicate(timeout=SAFETY_S)
    err = err.decode()
    assert tts.returncode == 1, err
    assert err.splitlines() == [err.strip()] and err.startswith("error: the RPC backend was "
                                                                "lost"), err
    assert "gdb" not in err and "Traceback" not in err


def test_tts_whose_backend_dies_writes_no_file(tiny, tmp_path):
    """Lost while it loads or while it speaks (whichever the kill meets), `tts -o FILE` ends
    in one line and leaves no file, whole or partial."""
    out = tmp_path / "out.wav"
    with LocalServer() as backend:
        tts = subprocess.Popen(tts_command(*tiny, backend, out), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        wait_for(lambda: "Accepted client connection" in backend.output() or
                 tts.poll() is not None, "tts reaching its backend")
    _, err = tts.communicate(timeout=SAFETY_S)
    assert tts.returncode == 1, err
    assert err.splitlines() == [err.strip()] and err.startswith("error:") and "RPC" in err, err
    assert "gdb" not in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())                 # nothing written, nothing half-written


@pytest.fixture
def serving(tiny, tmp_path):
    """`serve --backend rpc://...` on the tiny model: (url, the backend, a restart of it)."""
    model, codec = tiny
    backend = LocalServer()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moss_tts", "serve", "--model", str(model), "--codec", str(codec),
         "--backend", backend.name, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "MOSS_TTS_VOICES": str(tmp_path / "voices")})
    url = f"http://127.0.0.1:{port}"
    backends = [backend]
    try:
        wait_for(lambda: _health(url) or server.poll() is not None, "serve starting")
        assert server.poll() is None, server.communicate()
        yield url, backends
    finally:
        server.terminate()
        server.communicate(timeout=SAFETY_S)
        for b in backends:
            b.close()


def _health(url):
    """(status, body) of /health, or None while nothing answers."""
    try:
        status, _, body = call(url, "/health", timeout=5)
    except OSError:
        return None
    return status, json.loads(body)


def speak(client, **extra) -> bytes:
    return client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.",
                                      response_format="wav", extra_body={"seed": 1, **extra}
                                      ).read()


def test_serve_outlives_its_backend_and_serves_again_once_it_is_back(serving):
    url, backends = serving
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    before = speak(client, max_frames=20)
    assert len(sf.read(io.BytesIO(before))[0]) > 0
    # a streamed request in flight when the backend dies: it fails, alone
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=LONG_TEXT, response_format="pcm",
            extra_body={"stream_format": "audio", "seed": 2}) as streamed:
        chunks = streamed.iter_bytes()
        assert next(chunks)
        backends[0].close()                      # SIGKILL: a lost machine
        with pytest.raises(Exception):           # cut short, never a whole answer
            for _ in chunks:
                pass
    # the server is up, says the model is unavailable, and refuses in OpenAI's shape
    status, health = _health(url)
    assert status == 503 and health["status"] == "unavailable"
    assert "RPC backend was lost" in health["unavailable"]["moss-tts-nano"]["problem"]
    with pytest.raises(openai.APIStatusError) as refused:
        speak(client, max_frames=20)
    assert refused.value.status_code == 503
    assert "unavailable" in refused.value.message
    assert refused.value.response.headers["retry-after"]
    models = client.models.list().data
    assert models[0].model_extra["available"] is False
    # the backend comes back on the same address: the model is loaded again
    backends.append(LocalServer(endpoint=backends[0].endpoint))
    wait_for(lambda: (_health(url) or (0,))[0] == 200, "the model coming back")
    assert speak(client, max_frames=20) == before        # the same audio as before the loss
    assert client.models.list().data[0].model_extra["available"] is True


def test_a_batch_whose_backend_dies_stops_in_one_line_keeping_its_lines(batch_models, own_cache,  # noqa: F811
                                                                         tmp_path):
    rows = [{"id": "short", "text": "Hello there.", "max_frames": 8},
            {"id": "long", "text": LONG_TEXT}]
    manifest = write_jsonl(tmp_path / "lines.jsonl", rows)
    out = tmp_path / "out"
    with LocalServer() as backend:
        driver = batch_cli(manifest, out, batch_models, "--backend", backend.name,
                           "--workers", "1", popen=True)
        wait_for(lambda: (out / "short.wav").exists() or driver.poll() is not None,
                 "the first line made")
        assert driver.poll() is None, driver.communicate()
    _, err = driver.communicate(timeout=SAFETY_S)
    err = err.decode()
    assert driver.returncode == 1, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "batch: long: warning: the RPC backend was lost" in err      # said as it happened
    assert lines[-1].startswith("error:") and "no RPC server answers" in lines[-1], err
    assert "gdb" not in err and "Traceback" not in err and "ggml stopped" not in err
    made = {r["id"]: r for r in records(out) if r["status"] == "ok"}
    assert "short" in made and no_partials(out)


def test_a_killed_server_takes_its_model_process_along(serving):
    """The model's process ends with the server, even with SIGKILL (lifetime.end_with_parent)."""
    from tests.faults.test_batch_driver_kill import command, descendants, wait_until_ended

    url, _ = serving
    port = int(url.rsplit(":", 1)[1])
    server = next(pid for pid in descendants(os.getpid())
                  if "serve" in command(pid) and str(port) in command(pid))
    children = {pid: start for pid, start in descendants(server, depth=2).items()
                if "multiprocessing" in command(pid)}
    assert children, "no model process"
    os.kill(server, 9)
    assert wait_until_ended(children) == []
