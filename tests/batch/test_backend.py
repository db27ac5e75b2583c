"""`batch --backend`: each worker process opens the named backend itself; on a device whose
memory is not the host's (ggml's RPC backend serving the CPU, moss_tts/ggml/rpc.py) every line
is the CPU run's, alone or decoded together (issue 26)."""

import pytest

from tests.conftest import RPC_ACCEPTED as ACCEPTED

from .conftest import batch_cli, outputs, records, speech_rows, write_jsonl


def test_batch_on_an_rpc_backend_makes_the_cpu_runs_lines(batch_models, rpc_server, tmp_path):
    rows = [dict(row, seed=5 + i) for i, row in enumerate(speech_rows(3))]
    manifest = write_jsonl(tmp_path / "m.jsonl", rows)
    runs = {"rpc": ("--backend", rpc_server.name),
            "rpc-together": ("--backend", rpc_server.name, "--streams", 2),
            "cpu": ("--backend", "cpu")}
    made, clients = {}, {}
    for name, flags in runs.items():
        before = rpc_server.output().count(ACCEPTED)
        r = batch_cli(manifest, tmp_path / name, batch_models, "--quiet", *flags)
        assert r.returncode == 0, r.stderr
        clients[name] = rpc_server.output().count(ACCEPTED) - before
        assert [x["status"] for x in records(tmp_path / name)] == ["ok"] * 3
        made[name] = outputs(tmp_path / name)
    assert len(made["cpu"]) == 3 and len(set(made["cpu"].values())) == 3   # three distinct lines
    # guard: the workers themselves reached the server (each run's driver checks it with one
    # bare connection)
    assert clients["rpc"] >= 2 and clients["rpc-together"] >= 2 and clients["cpu"] == 0, clients
    assert made["rpc"] == made["cpu"]
    assert made["rpc-together"] == made["cpu"]


@pytest.mark.parametrize("flags, said", [
    (("--backend", "rpc://127.0.0.1:9"), "127.0.0.1:9"),
    (("--backend", "rpc://nowhere"), "expected rpc://HOST:PORT"),
    (("--backend", "no-such-device"), "is not a ggml backend: this build has cpu"),
    (("--backend", ""), "--backend '' is empty"),
])
def test_a_bad_backend_is_one_line_before_any_work(batch_models, tmp_path, flags, said):
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(2))
    r = batch_cli(manifest, tmp_path / "out", batch_models, *flags)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: --backend") and said in r.stderr
    assert not (tmp_path / "out").exists()


def test_two_workers_on_one_rpc_server_are_refused(batch_models, rpc_server, tmp_path):
    # the server serves one client at a time: the second worker would wait for ever
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(2))
    r = batch_cli(manifest, tmp_path / "out", batch_models, "--backend", rpc_server.name,
                  "--workers", 2)
    assert r.returncode == 1 and "one client at a time" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
