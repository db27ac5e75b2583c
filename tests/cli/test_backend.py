"""--backend on the command line: a device whose memory is not the host's (ggml's RPC backend
serving the CPU, moss_tts/ggml/rpc.py) speaks exactly as the CPU, and a bad name is one line."""

import numpy as np
import soundfile as sf


from .test_tts import cli, models  # noqa: F401


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
