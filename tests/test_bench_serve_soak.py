"""bench/serve_soak.py runs with serve --max-streams on (issue 25: "the soak runs with it on"):
a short soak of the tiny Nano server decoding 4 requests together runs every case, every
concurrent request equals its solo run, nothing is answered but 200 or 503, a request beside
a client that stops reading is served, and no error or traceback is logged. The soak's own
timings are printed, never asserted."""

import logging

from bench import serve_soak

SHORT = ("--requests 4 --clients 4 --per-client 2 --queue 1 --frames 8 --long-frames 40 "
         "--long-repeats 2 --first-audio 2 --held 8 --max-connections 4 --header-timeout 0.3 "
         "--live-places 2 --live-idle 0.3 --voices 4 --listers 1 --listing-seconds 0.2 "
         "--write-timeout 1 --threads 1 --max-streams 4").split()


def test_a_short_soak_runs_with_four_streams_decoded_together(tmp_path, capsys, caplog):
    args = serve_soak.parse_args(SHORT)
    with caplog.at_level(logging.WARNING):
        r = serve_soak.run_cases(args, tmp_path)
    _, statuses, mismatches = r["conc"]
    assert len(statuses) == 8 and set(statuses) <= {200, 503} and 200 in statuses
    assert mismatches == []
    assert r["nr"][0] == 200                        # served beside the stalled client
    assert r["xo"] == (403, True)
    assert r["held"][4] == 200                      # /health after the held connections
    assert r["idle"][2] == args.live_places         # every idle live socket's place is back
    assert not [rec.getMessage() for rec in caplog.records
                if rec.levelno >= logging.ERROR or rec.exc_info]
    serve_soak.report(args, r)
    assert "--max-streams 4" in capsys.readouterr().out
