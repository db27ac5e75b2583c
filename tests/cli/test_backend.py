"""--backend on the command line: a device whose memory is not the host's (ggml's RPC backend
serving the CPU, moss_tts/ggml/rpc.py) speaks exactly as the CPU, and a bad name is one line."""

import contextlib
import io
import subprocess
import sys
import time

import numpy as np
import openai
import soundfile as sf

from tests.conftest import RPC_ACCEPTED as ACCEPTED
from tests.server.helpers import call, tiny_model_files

from .test_serve import free_port
from .test_tts import SR, cli, models  # noqa: F401


def _speak(models, out, backend):
    return cli("tts-nano", "--model", models["tts_dir"], "--codec", models["codec"],
               "--text", "Hello world.", "--seed", 3, "--max-frames", 12, "--threads", 1,
               "--backend", backend, "-o", out)


def test_tts_on_an_rpc_backend_equals_cpu(models, rpc_server, tmp_path):
    for name, backend in (("rpc", rpc_server.name), ("cpu", "cpu")):
        r = _speak(models, tmp_path / f"{name}.wav", backend)
        assert r.returncode == 0, r.stderr
    rpc, cpu = (sf.read(tmp_path / f"{n}.wav", dtype="float32")[0] for n in ("rpc", "cpu"))
    assert cpu.size > 0 and np.abs(cpu).max() > 0
    np.testing.assert_array_equal(rpc, cpu)


def test_an_rpc_backend_with_no_server_is_a_one_line_error(models, tmp_path):
    r = _speak(models, tmp_path / "a.wav", "rpc://127.0.0.1:9")
    err = r.stderr.decode().strip()
    assert r.returncode != 0 and len(err.splitlines()) == 1, err
    assert "127.0.0.1:9" in err and "Traceback" not in err


def test_doctor_names_the_rpc_backend_and_how_to_reach_one():
    r = cli("doctor")
    assert r.returncode == 0, r.stderr
    assert "--backend rpc://HOST:PORT" in r.stdout.decode()


@contextlib.contextmanager
def serving(model, codec, backend):
    """`python -m moss_tts serve --backend BACKEND` on a free loopback port → its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moss_tts", "serve", "--model", model,
                             "--codec", codec, "--port", str(port), "--threads", "1",
                             "--backend", backend], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while proc.poll() is None:
            try:
                if call(url, "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
        yield url
    finally:
        proc.terminate()    # before the RPC server goes: its buffers are freed there
        proc.wait(30)


def test_serve_on_an_rpc_backend_speaks_as_the_cpu_server(rpc_server, tmp_path):
    """The stock `openai` client against `serve --backend rpc://...` and `serve --backend cpu`:
    the same WAV, whole and streamed."""
    model, codec = tiny_model_files(tmp_path)
    heard, clients = {}, {}
    for name in (rpc_server.name, "cpu"):
        before = rpc_server.output().count(ACCEPTED)
        with serving(model, codec, name) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            kw = dict(model="tts-1", voice="alloy", input="Hello there.", response_format="wav",
                      extra_body={"seed": 5, "max_new_frames": 12})
            whole = client.audio.speech.create(**kw).content
            with client.audio.speech.with_streaming_response.create(**kw) as r:
                streamed = b"".join(r.iter_bytes())
        clients[name] = rpc_server.output().count(ACCEPTED) - before
        assert streamed == whole
        heard[name] = sf.read(io.BytesIO(whole), dtype="float32")[0]
    # guard: the RPC server's process served the model (the CPU server never reached it)
    assert clients[rpc_server.name] >= 1 and clients["cpu"] == 0, clients
    cpu = heard["cpu"]
    assert cpu.size > 0 and np.abs(cpu).max() > 0, "silence: the comparison would be vacuous"
    np.testing.assert_array_equal(heard[rpc_server.name], cpu)


def test_voice_add_on_an_rpc_backend_stores_the_cpu_codes(models, rpc_server, tmp_path):
    """`voice add --backend`: the reference goes through the codec's encoder on the device."""
    from moss_tts.voices import load_voice

    t = np.arange(SR) / SR      # one second, two channels that differ
    ref = tmp_path / "ref.wav"
    sf.write(ref, np.stack([0.3 * np.sin(2 * np.pi * 200 * t), 0.1 * np.sin(2 * np.pi * 90 * t)],
                           1).astype(np.float32), SR)
    stored = {}
    for name in (rpc_server.name, "cpu"):
        before = rpc_server.output().count(ACCEPTED)
        root = tmp_path / name.replace("/", "_").replace(":", "_")
        r = cli("voice", "add", "alice", ref, "--codec", models["codec"], "--threads", 1,
                "--backend", name, env={"MOSS_TTS_VOICES": str(root)})
        assert r.returncode == 0, r.stderr
        assert (rpc_server.output().count(ACCEPTED) > before) == (name != "cpu")
        stored[name] = load_voice("alice", root=root)[0].codes
    assert stored["cpu"].size > 0 and len(np.unique(stored["cpu"])) > 1
    np.testing.assert_array_equal(stored[rpc_server.name], stored["cpu"])
