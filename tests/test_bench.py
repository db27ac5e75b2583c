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


def test_attention_bench_runs(capsys):
    from bench import attention

    assert attention.main(["--runs", "2", "--kv", "f32"]) == 0
    out = capsys.readouterr().out
    assert "softmax+vtrans µs" in out and "flash µs" in out
    rows = [line for line in out.splitlines() if line.startswith("f32 ")]
    assert [r.split()[1] for r in rows] == [s[0].split()[0] for s in attention.STAGES]
