"""bench/serve_bench.py (issue 35, part 2): a short run on the tiny Nano server reports every metric
of every level, finite, with no error; the underrun of a real-time player and the goal lines
follow their definitions. The figures are printed, never asserted: a time depends on the
machine."""

import json
import math

import pytest

from bench import serve_bench

METRICS = ("request_throughput", "audio_throughput", "mean_audio_duration_s",
           "median_audio_ttfp_ms", "p95_audio_ttfp_ms", "mean_audio_rtf", "p95_audio_rtf",
           "peak_rss_mb", "other_load", "duration_s")
STREAMED = ("mean_underrun_s", "max_underrun_s", "underrun_rate", "continuity_ok_rate")


def test_a_tiny_run_reports_every_metric_of_every_level(tmp_path, capsys):
    out = tmp_path / "serve_bench.json"
    args = serve_bench.parse_args(
        "--tiny --concurrency 1,2 --requests 2 --frames 8 --threads 1 --warmup 0 "
        f"--no-wait --json {out}".split())
    rows = serve_bench.run(args)
    assert [(r["mode"], r["concurrency"]) for r in rows] == [
        ("stream", 1), ("stream", 2), ("whole", 1), ("whole", 2)]
    for r in rows:
        assert r["errors"] == 0 and r["first_error"] is None, r["first_error"]
        assert r["completed"] == 2 * r["concurrency"] == len(r["records"])
        names = METRICS + (STREAMED if r["mode"] == "stream" else ())
        assert all(math.isfinite(r[name]) for name in names), r
        assert ("mean_underrun_s" in r) == (r["mode"] == "stream")
    kept = json.loads(out.read_text())      # rewritten as each level ends, finished at the last
    assert kept["levels"] == json.loads(json.dumps(rows)) and kept["finished"] is True
    report = capsys.readouterr().out
    assert "TTFP p95 ms" in report and "underrun s/req" in report and "CPU:" in report


def test_the_player_waits_whenever_the_audio_it_had_ran_out():
    one_second = 48000          # bytes of 24 kHz mono s16le
    # plays 0-1 s, waits 1-3, plays 3-4 (the third second came at 3.5 s), plays 4-5
    assert serve_bench.underrun_s([(0.0, one_second), (3.0, one_second),
                                   (3.5, one_second)], one_second) == 2.0
    # waits 1-2 s and 3-4.5 s
    assert serve_bench.underrun_s([(0.0, one_second), (2.0, one_second),
                                   (4.5, one_second)], one_second) == 2.5
    # ahead of real time throughout: never waits (its first packet starts the clock)
    assert serve_bench.underrun_s([(0.7, one_second), (1.2, one_second)], one_second) == 0.0


def level(concurrency, audio_throughput, ttfp_p50, ttfp_p95, underrun):
    return {"mode": "stream", "concurrency": concurrency, "audio_throughput": audio_throughput,
            "median_audio_ttfp_ms": ttfp_p50, "p95_audio_ttfp_ms": ttfp_p95,
            "max_underrun_s": underrun}


@pytest.mark.parametrize("busy, verdicts", [
    (level(4, 3.3, 250, 290, 0.0), ["met", "met", "met"]),
    (level(4, 2.5, 250, 400, 0.2), ["NOT met", "NOT met", "NOT met"])])
def test_the_goals_compare_four_streaming_clients_with_one(busy, verdicts):
    lines = serve_bench.goal_lines([level(1, 1.0, 200, 220, 0.0), busy])
    assert [line.rsplit(": ", 1)[1] for line in lines[1:]] == verdicts
    assert serve_bench.goal_lines([level(1, 1.0, 200, 220, 0.0)]) == []



def test_a_patched_server_with_the_budget_in_another_field_speaks(tmp_path, capsys):
    """--keep-speaking starts the server through a program that patches it first (Realtime's
    patch leaves Nano as it is); --budget-field names the field the budget goes in."""
    args = serve_bench.parse_args(
        "--tiny --concurrency 1 --requests 1 --modes stream --frames 4 --budget-field max_frames "
        f"--keep-speaking realtime --threads 1 --warmup 0 --no-wait --json {tmp_path / 'j'}"
        .split())
    [row] = serve_bench.run(args)
    assert row["errors"] == 0 and row["completed"] == 1, row["first_error"]
    report = capsys.readouterr().out
    assert "max_frames 4, kept speaking as realtime" in report
