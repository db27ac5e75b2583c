"""The batch command on real Ray clusters on loopback: one started with `ray start --head` in
its own process group (another environment and cwd than this driver, as on a remote machine),
with one actor killed mid-job — the dead actor is replaced, its unfinished lines re-run, each
line is recorded once, and the audio equals the local run's; and `--ray local`."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from moss_tts.batch import run_batch
from moss_tts.batch.ray_runner import CONNECT_TIMEOUT_S, NAMESPACE
from moss_tts.errors import InputError

from .conftest import batch_cli, no_partials, outputs, records, speech_rows, write_jsonl

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[batch]\")")


@pytest.fixture(autouse=True)
def no_ray_tokens(monkeypatch):
    """Loopback clusters only: no token to share between `ray start` and this driver (a
    driver process keeps the first mode it saw, so every test here uses the same)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A one-node Ray cluster on 127.0.0.1, started in /, without this process's MOSS_TTS_*
    variables; stopped by signalling its process group (never `ray stop`: that stops every
    Ray on the machine)."""
    log = tmp_path_factory.mktemp("ray") / "ray.log"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOSS_TTS_")}
    env["RAY_AUTH_MODE"] = "disabled"
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
           "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
           "--include-dashboard", "false", "--disable-usage-stats"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd="/", env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.time() + 90
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    yield f"127.0.0.1:{port}"
    # its workers run in process groups of their own, but all in the session `ray start` began
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(2)
    proc.wait()
    current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    if current.exists() and current.read_text().strip().endswith(f":{port}"):
        current.unlink()    # else `--ray auto` would keep trying this dead cluster


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
    return pids


def test_ray_local_starts_a_private_cluster_for_the_run(batch_models, tmp_path):
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(2))
    summary = run_batch(manifest, tmp_path / "out", model=str(batch_models["nano0"]),
                        codec=str(batch_models["codec"]), ray="local", workers=1)
    assert summary.made == 2 and not summary.failed and not ray.is_initialized()


def test_a_killed_actor_is_replaced_and_the_outputs_equal_the_local_run(
        batch_models, voice_env, ray_cluster, tmp_path, monkeypatch):
    # a stored voice from MOSS_TTS_VOICES and a reference relative to the manifest, run from
    # another directory: actors have neither the driver's environment nor its cwd
    monkeypatch.setenv("MOSS_TTS_VOICES", str(voice_env["root"]))
    monkeypatch.chdir("/")
    rows = speech_rows(12, max_frames=40)
    rows[1]["voice"] = "alice"
    rows[2]["reference"] = os.path.relpath(voice_env["ref"], tmp_path)
    manifest = write_jsonl(tmp_path / "m.jsonl", rows)
    kw = {"model": str(batch_models["nano0"]), "codec": str(batch_models["codec"]), "threads": 1}
    local = tmp_path / "local"
    run_batch(manifest, local, workers=1, **kw)
    killed = []

    def kill_an_actor(done, total, audio, elapsed):
        if not killed:      # after the first line: both actors are mid-chunk
            ray.kill(ray.get_actor("worker-1", namespace=NAMESPACE))
            killed.append(done)

    out = tmp_path / "ray"
    summary = run_batch(manifest, out, ray=ray_cluster, workers=2, chunk=4, progress=kill_an_actor,
                        **kw)
    assert killed and killed[0] < 12
    assert summary.replaced_workers == 1 and summary.made == 12 and not summary.failed
    recs = records(out)
    assert sorted(r["id"] for r in recs) == [f"line{i:03d}" for i in range(12)]  # once each
    assert sum(r["attempts"] for r in recs) > 12          # the killed actor's unfinished lines
    assert outputs(out) == outputs(local) and no_partials(out)                   # same audio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flag", ["address", "auto"])
def test_an_address_where_no_cluster_answers_is_one_line_before_any_work(batch_models,
                                                                        tmp_path, flag):
    """issue 22 #9: `--ray 127.0.0.1:1` waited past 240 s printing only Ray's lines (so did
    `--ray auto` with RAY_ADDRESS there). The subprocess limit only keeps a regression from
    hanging the suite."""
    address = f"127.0.0.1:{free_port()}"       # closed: nothing listens there
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(1))
    given = address if flag == "address" else "auto"
    r = batch_cli(manifest, tmp_path / "out", batch_models, "--ray", given,
                  env={"RAY_ADDRESS": address} if flag == "auto" else None,
                  timeout=CONNECT_TIMEOUT_S + 120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    where = address if flag == "address" else f"auto (RAY_ADDRESS={address})"
    assert f"--ray {where}: no Ray cluster answers there" in r.stderr
    assert not (tmp_path / "out").exists()


def test_an_address_that_answers_but_is_not_ray_is_one_error_too(batch_models, tmp_path):
    """issue 22 #9: a port that accepts connections but is no Ray cluster (here: a server
    that greets in plain text) kept Ray retrying; it is the same one error."""
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"

    def greet():
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    thread = threading.Thread(target=greet, daemon=True)
    thread.start()
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(1))
    with server, pytest.raises(InputError, match=rf"--ray {address}: no Ray cluster answers "
                                                 r"there \(not a gRPC server\)"):
        run_batch(manifest, tmp_path / "out", model=str(batch_models["nano0"]),
                  codec=str(batch_models["codec"]), ray=address)
    thread.join()


def test_ray_local_does_not_print_rays_token_authentication_warning(batch_models, tmp_path):
    """issue 22 #9: every `--ray local` run printed Ray's "Token authentication is enabled"
    warning. Ray as a user has it: no RAY_AUTH_MODE, and a home of the test's own (Ray keeps
    its token in ~/.ray)."""
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(1))
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    env["HOME"] = str(tmp_path / "home")
    r = batch_cli(manifest, tmp_path / "out", batch_models, "--ray", "local", "--workers", 1,
                  "--quiet", env=env, replace_env=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_streams_on_a_ray_actor_equal_the_local_run_one_line_at_a_time(batch_models, voice_env,
                                                                       tmp_path, monkeypatch):
    """--streams 3 on a Ray actor (chunks of whole batches, LineActor.run_chunk): each line's
    audio, record and warnings as a local run with --streams 1; bad lines fail alone."""
    from .test_streams import BAD, GOOD, by_id, manifest_rows

    monkeypatch.setenv("MOSS_TTS_VOICES", str(voice_env["root"]))
    manifest = write_jsonl(tmp_path / "m.jsonl", manifest_rows(batch_models))
    kw = {"model": str(batch_models["nano0"]), "codec": str(batch_models["codec"]), "threads": 1}
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    run_batch(manifest, local, workers=1, **kw)
    summary = run_batch(manifest, on_ray, ray="local", workers=1, streams=3, **kw)
    assert (summary.made, len(summary.failed)) == (len(GOOD), len(BAD)), summary.failed
    assert outputs(on_ray) == outputs(local) and by_id(on_ray) == by_id(local)
