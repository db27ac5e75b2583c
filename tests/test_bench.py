"""bench/ stays runnable: every driver imports (the drivers share bench/harness.py and each
other's helpers, and no test runs them whole: they take minutes on real-dims weights), the
harness's pieces behave, and the one-layer attention bench runs end to end."""

import importlib
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    module = importlib.import_module(f"bench.{name}")
    assert module.__doc__, f"bench/{name}.py has no docstring saying what it measures"


def test_harness_helpers():
    from bench import harness

    assert math.isnan(harness.median([])) and harness.median([3.0, 1.0, 2.0]) == 2.0
    assert harness.fmt(None) == "" and harness.fmt(float("nan")) == ""
    assert harness.fmt(1.234) == "1.23" and harness.fmt(12.5, "{:.0f}") == "12"
    assert 0.0 <= harness.Contention().share() <= 1.0 + 1e-6
    assert harness.peak_rss_gb() > 0.0
    said = []
    ok = harness.run_worker([sys.executable, "-c", "print('noise'); print('{\"x\": 1}')"],
                            "ok", said.append)
    assert ok["x"] == 1 and ok["wall_s"] > 0 and not said
    bad = harness.run_worker([sys.executable, "-c", "raise SystemExit('boom')"], "bad",
                             said.append)
    assert bad == {"error": "boom"} and said and said[0].startswith("FAILED (1): bad")


def test_report_pieces_the_drivers_share():
    from bench import harness

    done, busy = {"median_s": 2.5, "foreign": 0.123}, {"foreign": float("nan")}
    assert harness.other_load(done, busy, {}) == "12//"
    assert harness.rtf(10.0, done, {}) == "0.250/"
    assert harness.conversion_lines({}) == []
    lines = harness.conversion_lines({"f16": {"seconds": 3.04, "bytes": 1.5e9, "peak_rss_gb": 2.0},
                                      ("v2", "q8_0"): {"seconds": 60.0, "bytes": 2.3e9,
                                                       "peak_rss_gb": 1.25}})
    assert lines == ["### conversion (this run)", "- f16: 3.0 s, 1.50 GB, peak RSS 2.00 GB",
                     "- v2 q8_0: 60.0 s, 2.30 GB, peak RSS 1.25 GB", ""]
    assert harness.start_line("bench/x.py").startswith("=== bench/x.py ")


def test_attention_bench_runs(capsys):
    from bench import attention

    assert attention.main(["--runs", "2", "--kv", "f32"]) == 0
    out = capsys.readouterr().out
    assert "softmax+vtrans µs" in out and "flash µs" in out
    rows = [line for line in out.splitlines() if line.startswith("f32 ")]
    assert [r.split()[1] for r in rows] == [s[0].split()[0] for s in attention.STAGES]


def test_bench_sources_hold_no_path_of_one_machine():
    for path in sorted(BENCH.glob("*.py")):
        text = path.read_text()
        for needle in ("/work/", ".mirror", "/home/"):
            assert needle not in text, f"bench/{path.name} hard-codes {needle!r}"


def test_upstream_source_comes_from_the_flag_or_the_environment(tmp_path, monkeypatch):
    import subprocess

    from bench import harness

    monkeypatch.delenv(harness.UPSTREAM_ENV, raising=False)
    with pytest.raises(SystemExit, match="--upstream-src DIR or set MOSS_TTS_UPSTREAM_CODEC") as e:
        harness.upstream_source(None)
    assert "OpenMOSS/MOSS-Audio-Tokenizer" in str(e.value)  # says what to fetch
    with pytest.raises(SystemExit, match="not a directory"):
        harness.upstream_source(str(tmp_path / "missing"))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text('{"a": 1}')
    monkeypatch.setenv(harness.UPSTREAM_ENV, str(plain))
    assert harness.upstream_source(None) == plain
    assert harness.upstream_file(plain, "config.json") == '{"a": 1}'
    assert harness.upstream_commit(plain) == "?"
    with pytest.raises(SystemExit, match="no modeling.py"):
        harness.upstream_file(plain, "modeling.py")
    repo = tmp_path / "repo"   # a git mirror: the file read from HEAD, not the working tree
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (repo / "config.json").write_text('{"b": 2}')
    subprocess.run(git + ["add", "config.json"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "c"], check=True)
    (repo / "config.json").unlink()
    assert harness.upstream_source(str(repo)) == repo
    assert harness.upstream_file(repo, "config.json") == '{"b": 2}'
    assert len(harness.upstream_commit(repo)) == 40


def test_codec_bench_reads_the_real_config_from_the_upstream_source(tmp_path, monkeypatch):
    from bench import codec, harness

    monkeypatch.setattr(codec, "CKPT", tmp_path / "checkpoint")
    monkeypatch.delenv(harness.UPSTREAM_ENV, raising=False)
    with pytest.raises(SystemExit, match="MOSS_TTS_UPSTREAM_CODEC"):
        codec.real_config()
    (tmp_path / "config.json").write_text('{"sampling_rate": 24000}')
    assert codec.real_config(str(tmp_path)) == {"sampling_rate": 24000}


def test_codec48k_builds_a_missing_gguf_for_other_drivers(tmp_path, monkeypatch):
    """bench/nano.py's first audio needs the Nano codec GGUF: ensure_gguf makes the checkpoint and
    converts it when absent (here on the tiny Nano config, the real one takes minutes)."""
    from bench import codec48k
    from fixtures.make_codec import tiny_nano_config
    from moss_tts.codec import Codec

    plan = codec48k.checkpoint_plan(tiny_nano_config())
    monkeypatch.setattr(codec48k, "WORK", tmp_path)
    monkeypatch.setitem(codec48k.REAL_CONFIGS, "nano", tiny_nano_config)
    monkeypatch.setitem(codec48k.EXPECTED, "nano",
                        (sum(math.prod(s) for _, s, _, _ in plan), len(plan)))
    path = codec48k.ensure_gguf("nano", "f32", log=lambda msg: None)
    assert path == tmp_path / "nano-f32.gguf" and path.is_file()
    with Codec.load(path, threads=1) as c:
        assert c.channels == 2 and c.sample_rate == 1600
    mtime = path.stat().st_mtime_ns
    assert codec48k.ensure_gguf("nano", "f32", log=lambda msg: None) == path   # reused
    assert path.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("variant", ["v1", "nano", "v2"])
def test_codec_checkpoint_plan_is_the_fixtures_layout_and_shards_read_back(variant, tmp_path):
    """The real-dims codec benches' one tensor plan (bench/codec_checkpoint.py) has the names and
    shapes fixtures/make_codec.py writes for each layout, and its sharded checkpoint reads back
    whole, one tensor per plan entry, at least two shards."""
    from bench import codec_checkpoint as cc
    from fixtures import make_codec

    config = {"v1": make_codec.tiny_v1_config, "nano": make_codec.tiny_nano_config,
              "v2": make_codec.tiny_v2_config}[variant]()
    plan = cc.checkpoint_plan(config, cc.V1 if variant == "v1" else cc.NANO_V2)
    want = {n: a.shape for n, a in getattr(make_codec, f"make_tiny_{variant}_state")(config).items()}
    assert {n: s for n, s, _, _ in plan} == want
    out = cc.write_sharded(tmp_path / "ckpt", config, plan, shard_bytes=1 << 16, log=lambda m: None)
    state = make_codec.load_state(out)
    assert {n: a.shape for n, a in state.items()} == want and make_codec.load_config(out) == config
    assert len(list(out.glob("model-*.safetensors"))) >= 2


def test_fma_peak_follows_the_vector_width_clock_and_cores(monkeypatch):
    from bench import common

    monkeypatch.setattr(common, "_cpuinfo", lambda: ("x", ["fma", "avx2", "avx512f"], 2000.0))
    assert common.fma_peak_gflops(2)[0] == 16 * 2 * 2 * 2.0 * 2      # 256 GFLOP/s
    monkeypatch.setattr(common, "_cpuinfo", lambda: ("x", ["fma", "avx2"], 2450.0))
    assert common.fma_peak_gflops(2)[0] == pytest.approx(8 * 2 * 2 * 2.45 * 2)   # ≈ 157


def test_matmul_bench_times_plain_and_repacked_in_turn(capsys):
    from bench import matmul
    from moss_tts.ggml import GGMLType, get_backend, repack

    repacks = repack.Packer(get_backend()).eligible(GGMLType.Q4_0, (4096, 4096, 1, 1))
    assert matmul.main(["--types", "f32,q4_0", "--rows", "8", "--gib", "0.07", "--repeat", "1",
                        "--peak-n", "64"]) == 0
    out = capsys.readouterr().out
    assert "CPU: " in out and "FMA figure" in out
    assert ("ggml q4_0 repacked" in out) == repacks and "ggml f32 repacked" not in out
    assert "× f32" in out and "1.00" in out    # f32 against itself


def test_matmul_codec_mode_sums_every_layer_shape(capsys, monkeypatch):
    from bench import matmul

    # two tiny stages: 2 layers at 8 wide (4 shapes each) and 1 layer at 16 wide
    monkeypatch.setattr(matmul, "CODEC_ENCODER_10S", ((32, 8, 32, 2), (16, 16, 64, 1)))
    shapes = matmul.codec_shapes()
    assert shapes[:4] == [(8, 24, 32, 2), (8, 8, 32, 2), (8, 32, 32, 2), (32, 8, 32, 2)]
    assert len(shapes) == 8 and shapes[-1] == (64, 16, 16, 1)
    assert matmul.main(["--codec", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("ggml") >= 2 and "8 x 24" in out and "64 x 16" in out
    assert "all of them: ggml" in out and "torch" not in out.split("all of them:")[1]


def test_peak_probe_prints_json_and_rates_read_against_it(capsys):
    import json

    from bench import harness, matmul

    assert matmul.main(["--peak-only", "--peak-n", "64", "--repeat", "1"]) == 0
    peak = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert peak["peak"] == max(peak["numpy"], peak["ggml"]) > 0 and peak["n"] == 64
    assert peak["cpu"] and peak["fma"] > 0
    assert harness.of_peak(50.0, 0.5, {"peak": 200.0}) == "100 (50 %)"
    assert harness.of_peak(50.0, 0.5, None) == "100"
    assert harness.of_peak(None, 0.5, peak) == "" and harness.of_peak(1.0, float("nan"), peak) == ""
    assert "'% of peak' uses the measured" in harness.peak_line(peak)
    # probed twice (the host drifts): the best probe is the peak, both are listed
    probes = iter([{**peak, "peak": 100.0}, {**peak, "peak": 150.0}, {"error": "busy"}])
    driver = type("D", (), {"run": lambda self, cmd: next(probes)})()
    for _ in range(3):
        harness.measure_peak(driver, 2)
    assert driver.peak["peak"] == 150.0 and driver.peak["probes"] == [100.0, 150.0]
    assert "probes at start and end: 100, 150" in harness.peak_line(driver.peak)
    assert harness.peak_line(None).startswith("peak: not measured")


def test_prefill_times_gives_the_work_of_one_prefill_where_it_runs_ggml_graphs():
    import numpy as np

    from bench import harness
    from moss_tts.ggml import Graph, ops

    k, n, m = 64, 48, 10
    g = Graph(name="prefill")
    g.output(ops.mul_mat(g.input("w", (n, k)), g.input("x", (m, k))), "y")
    feed = {"w": np.ones((n, k), np.float32), "x": np.ones((m, k), np.float32)}
    try:
        out = harness.prefill_times(lambda: g.run(feed), runs=2)
    finally:
        g.close()
    assert out["prefill_gflop"] == pytest.approx(2 * k * n * m / 1e9)
    assert out["prefill_ms"] > 0
    assert "prefill_gflop" not in harness.prefill_times(lambda: None, runs=1)   # a torch peer


def test_prefill_rates_give_a_peer_the_work_of_our_graphs_for_the_same_prompt():
    from bench import harness

    rows = [{"side": "ours", "error": "no weights"},
            {"side": "ours", "prefill_ms": 500.0, "prefill_gflop": 100.0},
            {"side": "llama.cpp", "prefill_ms": 1000.0},                   # runs no graph of ours
            {"side": "ours", "prefill_ms": 250.0, "prefill_gflop": 100.0}]
    assert harness.prefill_work(rows) == 100.0
    harness.rate_prefills(rows, {"peak": 400.0})
    rate = harness.PREFILL_RATE
    assert [r.get(rate) for r in rows] == [None, "200 (50 %)", "100 (25 %)", "400 (100 %)"]
    assert harness.prefill_work([{"side": "peer", "prefill_ms": 9.0}]) is None


@pytest.fixture
def busy_machine(monkeypatch):
    """A machine that is never quiet (another bench runs and the CPUs are taken), where any
    wait fails the test at once instead of sleeping."""
    from bench import harness

    def no_sleeping(seconds):
        raise AssertionError(f"the bench waited ({seconds} s) although --no-wait was given")

    monkeypatch.setattr(harness, "other_bench_processes", lambda: ["1: python bench/other.py"])
    monkeypatch.setattr(harness, "foreign_share", lambda seconds=2.0: 1.0)
    monkeypatch.setattr(harness.time, "sleep", no_sleeping)
    runs = []

    def busy_worker(cmd, line, say):
        runs.append(line)
        return {"foreign": 1.0, "x": 1}

    monkeypatch.setattr(harness, "run_worker", busy_worker)
    return runs


def test_no_wait_driver_never_waits_nor_measures_again_on_a_busy_machine(busy_machine, tmp_path):
    """issue 22 #11: `--no-wait` still waited in measure_peak (a `run` with the default
    timing=True), so the tiny bench test hung on a busy machine."""
    import argparse

    from bench import harness

    d = harness.Driver(argparse.Namespace(no_wait=True, threads=1), tmp_path / "log.txt",
                       BENCH / "matmul.py")
    assert d.run([sys.executable, "bench/matmul.py", "--peak-only"])["x"] == 1
    assert d.worker("ours", frames=8)["x"] == 1
    assert len(busy_machine) == 2   # one run each: no re-measuring either


def test_codec_bench_driver_never_waits_with_no_wait(monkeypatch, tmp_path):
    import argparse

    from bench import codec

    monkeypatch.setattr(codec.time, "sleep", lambda s: pytest.fail(f"waited {s} s"))
    monkeypatch.setattr(codec, "WORK", tmp_path)
    d = codec.Driver(argparse.Namespace(no_wait=True, threads=1, runs=1))
    runs = []
    monkeypatch.setattr(d, "_run", lambda cmd, record=True: runs.append(cmd) or {"foreign": 1.0})
    assert d.run(["x"]) == {"foreign": 1.0} and len(runs) == 1


@pytest.mark.parametrize("name", [m for m in MODULES if m != "harness"
                                  and "Driver(" in (BENCH / f"{m}.py").read_text()])
def test_every_bench_with_a_driver_takes_no_wait(name):
    """A test can run any driver without waiting for a quiet machine: each takes --no-wait."""
    assert "add_no_wait(ap)" in (BENCH / f"{name}.py").read_text(), name
