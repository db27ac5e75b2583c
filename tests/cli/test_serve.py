"""`python -m moss_tts serve` as a user starts it: the access flags reach the server."""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from moss_tts.voices import add_voice
from tests.server.helpers import call, silent_wav_b64, tiny_model_files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-serve")
    model, codec = tiny_model_files(d)
    port = free_port()
    env = os.environ | {"MOSS_TTS_API_KEY": "sk-env", "MOSS_TTS_VOICES": str(d / "voices")}
    add_voice("stored", np.zeros((4, 2), np.int32), {}, root=d / "voices")
    proc = subprocess.Popen([sys.executable, "-m", "moss_tts", "serve", "--model", model,
                             "--codec", codec, "--port", str(port), "--threads", "1",
                             "--access-log", "--cors-origin", "http://app.example",
                             "--allowed-host", "tts.lan", "--write-timeout", "3",
                             "--max-voices", "1", "--max-streams", "2", "--queue", "3"],
                            env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if call(url, "/health", timeout=2)[0] == 200:
                break
        except OSError:
            time.sleep(0.2)
    yield url, port, proc
    proc.terminate()
    proc.wait(10)


def test_max_voices_reaches_the_server(served):
    """One voice is stored and serve has --max-voices 1 (this runs before the next test,
    which stops the server)."""
    url, _, _ = served
    status, _, body = call(url, "/v1/audio/voices", {"name": "more", "audio": silent_wav_b64()},
                           headers={"Authorization": "Bearer sk-env"})
    assert status == 409 and "--max-voices" in body.decode()


def test_serve_flags_reach_the_server(served):
    url, port, proc = served
    assert call(url, "/v1/models")[0] == 401                               # the env key
    st, _, body = call(url, "/v1/models", headers={"Authorization": "Bearer sk-env"})
    assert st == 200 and json.loads(body)["data"][0]["free_places"] == 2 + 3   # --max-streams
    assert call(url, "/health", headers={"Host": f"tts.lan:{port}"})[0] == 200
    st, h, _ = call(url, "/health", headers={"Origin": "http://app.example"})
    assert st == 200 and h["access-control-allow-origin"] == "http://app.example"
    assert call(url, "/health", headers={"Origin": "http://evil.example"})[0] == 403
    proc.terminate()
    err = proc.communicate(timeout=10)[1]
    assert '"GET /v1/models" 401' in err and '"GET /health" 403' in err   # --access-log


def test_serve_rejects_a_non_positive_write_timeout():
    out = subprocess.run([sys.executable, "-m", "moss_tts", "serve", "--write-timeout", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--write-timeout" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_serve_warns_when_it_binds_beyond_loopback_without_a_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MOSS_TTS_API_KEY"}
    out = subprocess.run([sys.executable, "-m", "moss_tts", "serve", "--host", "0.0.0.0",
                          "--model", tmp_path / "missing.gguf", "--codec", tmp_path / "c.gguf"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert "without --api-key" in out.stderr and out.returncode != 0


def test_serve_refuses_more_connections_than_the_process_may_open(tmp_path):
    out = subprocess.run([sys.executable, "-m", "moss_tts", "serve", "--max-connections",
                          str(10 ** 9), "--model", tmp_path / "missing.gguf"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--max-connections" in out.stderr
    assert "ulimit -n" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_serve_takes_a_queue_of_0_as_the_server_does(tmp_path):
    """`--queue 0` (only the running requests, none waiting) is a line the server takes (the
    server tests and bench/serve_attacks.py serve with it); the flag alone refused it."""
    out = subprocess.run([sys.executable, "-m", "moss_tts", "serve", "--queue", "0",
                          "--model", tmp_path / "missing.gguf"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "--queue" not in out.stderr and "--model" in out.stderr
