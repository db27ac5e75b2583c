"""--backend on the command line: a device whose memory is not the host's (ggml's RPC backend
serving the CPU, moss_tts/ggml/rpc.py) speaks exactly as the CPU, and a bad name is one line."""

import contextlib
import io
import os
import subprocess
import sys
import time

import numpy as np
import openai
import pytest
import soundfile as sf

from tests.conftest import RPC_ACCEPTED as ACCEPTED
from tests.ggml.test_backend_names import cuda_without_device  # noqa: F401
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


def test_doctor_and_backend_cuda_say_a_cuda_build_has_no_device_here(cuda_without_device,
                                                                     models, tmp_path, capsys):
    """issue 35: the CUDA build on a machine without a GPU: doctor left cuda out of its
    backends without a word, as if it were not built; each now says why in one line."""
    from moss_tts.cli import main

    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if line.split()[:1] == ["cuda"]]
    assert said == [f"  cuda     built, but no device on this machine ({cuda_without_device})"], lines
    assert "smoke test (2x2 matmul on cpu): ok" in lines
    out = tmp_path / "a.wav"
    try:
        code = main(["tts-nano", "--model", str(models["tts_dir"]), "--codec", str(models["codec"]),
                     "--text", "Hi.", "--backend", "cuda", "-o", str(out)])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and not out.exists(), err
    assert err.startswith("error: --backend 'cuda': this ggml build has CUDA but finds no CUDA "
                          f"device on this machine ({cuda_without_device})"), err


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


# every command that takes --backend: (its arguments, given files that need not exist: the name
# is checked before anything is read, resolved or loaded)
BACKEND_COMMANDS = {
    "tts": ("tts", "--text", "Hi.", "-o", "{out}/a.wav"),
    "tts-nano": ("tts-nano", "--text", "Hi.", "-o", "{out}/a.wav"),
    "serve": ("serve", "--port", "0"),
    "batch": ("batch", "{out}/m.jsonl", "--out", "{out}/b"),
    "voice add": ("voice", "add", "alice", "{out}/ref.wav"),
    "encode": ("encode", "{out}/in.wav", "--codec", "{out}/c.gguf", "-o", "{out}/a.npy"),
    "decode": ("decode", "{out}/in.npy", "--codec", "{out}/c.gguf", "-o", "{out}/a.wav"),
    "reconstruct": ("reconstruct", "{out}/in.wav", "--codec", "{out}/c.gguf", "-o",
                    "{out}/a.wav"),
}


@pytest.mark.parametrize("backend, said", [
    ("", "error: --backend '' is empty: name one this ggml build has (cpu"),
    ("nonsense", "error: --backend 'nonsense' is not a ggml backend: this build has cpu"),
    ("vulkan", "error: --backend 'vulkan' is not in this ggml build (it has cpu"),
])
@pytest.mark.parametrize("command", sorted(BACKEND_COMMANDS))
def test_a_bad_backend_is_the_same_line_from_every_command(command, backend, said, tmp_path):
    """`--backend ""` ran on the CPU and `vulkan` / `nonsense` advised MOSS_TTS_GGML_CUDA=1; each
    command said it its own way, after resolving (or downloading) its model."""
    args = [a.format(out=tmp_path) for a in BACKEND_COMMANDS[command]]
    env = {**os.environ, "MOSS_TTS_VOICES": str(tmp_path / "voices"), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "moss_tts", *args, "--backend", backend],
                       capture_output=True, text=True, env=env,
                       timeout=120)        # a safety net: a serve that took the name would serve
    err = r.stderr
    assert r.returncode == 1 and err.startswith(said) and err.count("\n") == 1, err
    if backend == "vulkan":
        assert "MOSS_TTS_GGML_VULKAN=1" in err and "CUDA" not in err, err
    assert not (tmp_path / "a.wav").exists() and not (tmp_path / "b").exists()


def test_load_tts_refuses_an_empty_backend(tmp_path):
    from moss_tts import Codec, load_tts
    from moss_tts.errors import BackendError

    model, codec = tiny_model_files(tmp_path)
    with pytest.raises(BackendError, match=r"^backend '' is empty"):
        load_tts(model, codec=codec, backend="")
    with pytest.raises(BackendError, match=r"^backend 'vulkan' is not in this ggml build .*"
                                           r"MOSS_TTS_GGML_VULKAN=1"):
        Codec.load(codec, backend="vulkan")
    with load_tts(model, codec=codec, threads=1) as tts:      # left out: the CPU
        assert tts.synthesize("Hi.", seed=1, max_frames=2)[0].size > 0
