"""bench/device.py (the decode-step bench of bench/gpu_check.sh) runs every case end to end at
tiny dimensions on a device (ggml's RPC backend serving the CPU) beside the CPU."""

import json

from bench import device


def test_every_case_runs_on_the_device_and_the_cpu(rpc_server, tmp_path, capsys):
    out = tmp_path / "results.json"
    rc = device.main(["--tiny", "--threads", "1", "--steps", "3", "--backend", rpc_server.name,
                      "--device-gbs", "4800", "--data", str(tmp_path / "data"),
                      "--json", str(out)])
    results = json.loads(out.read_text())
    assert rc == 0, [r.get("error") for r in results]
    assert [(r["case"], r["backend"]) for r in results] == [
        (case, side) for case in device.CASES for side in ("cpu", rpc_server.name)]
    for r in results:
        assert r["steps"] == 3 and r["step_ms"] > 0 and r["step_mb"] > 0
        # the floor is the bytes a step reads at the side's bandwidth
        assert abs(r["floor_ms"] - r["step_mb"] / r["read_gbs"]) < 1e-9 * r["floor_ms"] + 1e-12
    assert [r["read_gbs"] for r in results if r["backend"] != "cpu"] == [4800.0] * 4
    assert "tiny dims" in capsys.readouterr().out


def test_a_failing_case_is_a_row_and_a_nonzero_exit(tmp_path, capsys):
    rc = device.main(["--tiny", "--no-cpu", "--backend", "rpc://127.0.0.1:9", "--cases",
                      "nano:f32", "--data", str(tmp_path)])
    assert rc == 1 and "127.0.0.1:9" in capsys.readouterr().out
