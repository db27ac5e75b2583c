"""Backend threads: more than the usable cores is capped, with a warning (issue 11: 1000
spinning OpenMP threads made a 1 s job take 6 minutes)."""

import logging
import os

from moss_tts.ggml.backend import Backend, usable_cores


def test_threads_past_the_usable_cores_are_capped_with_a_warning(caplog):
    cores = len(os.sched_getaffinity(0))
    assert usable_cores() == cores
    with caplog.at_level(logging.WARNING, logger="moss_tts.ggml.backend"):
        with Backend("cpu", threads=1000) as b:
            assert b.threads == cores
            b.set_threads(cores)
            assert b.threads == cores
    assert [r.getMessage() for r in caplog.records] == [
        f"1000 threads requested, but this process may use {cores} cores: using {cores}"]


def test_the_environment_variable_goes_through_the_same_cap(monkeypatch, caplog):
    monkeypatch.setenv("MOSS_TTS_THREADS", "999")
    with caplog.at_level(logging.WARNING, logger="moss_tts.ggml.backend"):
        with Backend("cpu") as b:
            assert b.threads == usable_cores()
    assert "999 threads requested" in caplog.text
