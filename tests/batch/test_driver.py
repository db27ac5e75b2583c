"""run_batch in this process on local workers: the audio of each line is what NanoTTS makes for
that line's seed and model; bad lines fail alone; a dead worker's line is re-run."""

import hashlib
import multiprocessing
import os
import signal
import sys

import numpy as np
import pytest
import soundfile as sf

from moss_tts.audio import quantize
from moss_tts.batch import derive_seed, run_batch
from moss_tts.batch.driver import Job
from moss_tts.batch.ledger import Ledger
from moss_tts.errors import InputError
from moss_tts.models.nano_tts import NanoTTS, Reference

from .conftest import FRAMES, SR, no_partials, outputs, read, records, speech_rows, write_jsonl


def run(manifest, out, models, **kw):
    return run_batch(manifest, out, model=str(models["nano0"]), codec=str(models["codec"]),
                     threads=1, **kw)


def test_each_line_is_its_models_synthesis_with_its_seed_and_bad_lines_fail_alone(
        batch_models, voice_env, tmp_path, monkeypatch):
    monkeypatch.setenv("MOSS_TTS_VOICES", str(voice_env["root"]))
    good = [{"id": "given-seed", "text": "Hello there.", "seed": 11, "max_frames": FRAMES},
            {"id": "derived-seed", "text": "Hello there.", "max_frames": FRAMES},
            {"id": "other-model", "text": "Hello there.", "seed": 11, "max_frames": FRAMES,
             "model": str(batch_models["nano1"])},
            {"id": "voice", "text": "Hello there.", "seed": 11, "max_frames": FRAMES,
             "voice": "alice"},
            {"id": "reference", "text": "Hello there.", "seed": 11, "max_frames": FRAMES,
             "reference": str(voice_env["ref"]), "temperature": 0.5, "top_k": 5}]
    bad = [{"id": "empty", "text": ""}, {"id": "nobody", "text": "Hi.", "voice": "bob"},
           {"id": "codec-as-model", "text": "Hi.", "model": str(batch_models["codec"])},
           {"id": "no-model", "text": "Hi.", "model": str(tmp_path / "missing.gguf")}]
    out = tmp_path / "out"
    summary = run(write_jsonl(tmp_path / "m.jsonl", bad[:2] + good + bad[2:]), out, batch_models,
                  workers=2)
    assert (summary.total, summary.made, summary.skipped) == (9, 5, 0)
    errors = dict(summary.failed)
    assert errors["empty"] == "text is empty"
    assert "no voice named 'bob'" in errors["nobody"]
    assert "a 'codec' GGUF, not a speech model" in errors["codec-as-model"]
    assert "missing.gguf" in errors["no-model"] and len(errors) == 4
    assert set(outputs(out)) == {f"{r['id']}.wav" for r in good} and no_partials(out)

    with NanoTTS.load(batch_models["nano0"], codec=batch_models["codec"], threads=1) as tts0, \
            NanoTTS.load(batch_models["nano1"], codec=batch_models["codec"], threads=1) as tts1:
        def want(tts, seed, **kw):
            return tts.synthesize("Hello there.", seed=seed, max_frames=FRAMES, **kw)[0]
        expected = {
            "given-seed": want(tts0, 11), "derived-seed": want(tts0, derive_seed("derived-seed")),
            "other-model": want(tts1, 11),
            "voice": want(tts0, 11, reference=Reference(voice_env["codes"])),
            "reference": want(tts0, 11, reference=tts0.encode_reference(*sf.read(
                voice_env["ref"], dtype="float32")), options=__import__(
                    "moss_tts").SamplingOptions(audio_temperature=0.5, audio_top_k=5))}
    for line_id, audio in expected.items():
        assert np.array_equal(read(out / f"{line_id}.wav"), quantize(audio, "s16")), line_id
    # sensitivity: the model, the seed and the voice each change the audio
    assert not np.array_equal(expected["given-seed"], expected["other-model"])
    assert not np.array_equal(expected["given-seed"], expected["derived-seed"])
    assert not np.array_equal(expected["given-seed"], expected["voice"])

    by_id = {r["id"]: r for r in records(out)}
    sha0 = hashlib.sha256(batch_models["nano0"].read_bytes()).hexdigest()
    assert by_id["given-seed"]["model_sha256"] == sha0 != by_id["other-model"]["model_sha256"]
    assert by_id["derived-seed"]["seed"] == derive_seed("derived-seed")
    assert by_id["given-seed"]["duration"] == FRAMES * 32 / SR
    assert by_id["nobody"]["status"] == "failed" and by_id["nobody"]["attempts"] == 1


def test_killed_workers_are_replaced_and_their_lines_rerun_once(batch_models, tmp_path):
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(8))
    clean = tmp_path / "clean"
    run(manifest, clean, batch_models, workers=1)
    killed = []

    def kill_the_workers(done, total, audio, elapsed):
        if not killed:  # one has just finished a line (idle), the other is mid-line
            for worker in multiprocessing.active_children():
                os.kill(worker.pid, signal.SIGKILL)
                worker.join()         # dead before the driver sends the idle one a line
                killed.append(worker.pid)

    out = tmp_path / "out"
    summary = run(manifest, out, batch_models, workers=2, progress=kill_the_workers)
    assert len(killed) == 2 and summary.replaced_workers == 2
    assert summary.made == 8 and not summary.failed
    recs = records(out)
    assert sorted(r["id"] for r in recs) == [f"line{i:03d}" for i in range(8)]   # once each
    assert sum(r["attempts"] for r in recs) == 10         # each dead worker cost one attempt
    assert outputs(out) == outputs(clean) and no_partials(out)    # 1 or 2 workers: same audio


def test_retryable_failures_are_retried_then_recorded_and_input_errors_are_not(tmp_path):
    from moss_tts.batch.manifest import Line
    with Ledger(tmp_path) as ledger:
        job = Job(ledger, suffix=".wav", retries=2)
        for line_id in ("flaky", "wrong"):
            job.add(Line(number=1, id=line_id, text="x", seed=1), model="m", model_sha256="0",
                    model_error=None, codec="c", codec_sha256="0")
        tries = {"flaky": 0, "wrong": 0}
        while tasks := job.take():
            task = tasks[0]
            tries[task["id"]] += 1
            if task["id"] == "flaky":
                job.lost(task, "worker process died (exit code -9)")
            else:
                job.finish(task, {"status": "failed", "error": "text is empty", "retry": False})
    assert tries == {"flaky": 3, "wrong": 1}
    assert {r["id"]: (r["status"], r["attempts"], r["error"]) for r in records(tmp_path)} == {
        "flaky": ("failed", 3, "worker process died (exit code -9)"),
        "wrong": ("failed", 1, "text is empty")}


def test_ray_flag_without_ray_says_how_to_install_it(batch_models, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)               # import ray → ImportError
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(1))
    with pytest.raises(InputError, match=r'--ray needs Ray: pip install -e "\.\[batch\]"'):
        run(manifest, tmp_path / "out", batch_models, ray="local")


@pytest.mark.parametrize("kw, message", [({"fmt": "mp3"}, "format 'mp3'"),
                                         ({"retries": -1}, "--retries must be"),
                                         ({"workers": 0}, "--workers")])
def test_bad_arguments_are_one_error(batch_models, tmp_path, kw, message):
    with pytest.raises(InputError, match=message):
        run(write_jsonl(tmp_path / "m.jsonl", speech_rows(1)), tmp_path / "out", batch_models, **kw)



def test_an_unwritable_output_stops_the_run_with_one_error_and_no_record(tmp_path):
    from moss_tts.batch.manifest import Line
    with Ledger(tmp_path) as ledger:
        job = Job(ledger, suffix=".wav", retries=0)
        job.add(Line(number=1, id="a", text="x", seed=1), model="m", model_sha256="0",
                model_error=None, codec="c", codec_sha256="0")
        (tmp_path / "a.wav").mkdir()            # the rename onto a directory fails
        with pytest.raises(InputError, match=r"a\.wav: cannot write .*rerun to resume"):
            job.finish(job.take()[0], {"status": "ok", "audio": b"RIFF", "duration": 1.0})
    assert records(tmp_path) == [] and no_partials(tmp_path)


def test_a_delay_model_runs_its_lines_with_its_own_options(tmp_path, tiny_codec):
    """The family comes from the model GGUF (as `tts`): a MossTTSDelay line gets DelayTTS's
    synthesis with the line's seed, its sampling over Delay's defaults and its row cap; a
    Nano-only option on a Delay line fails that line alone."""
    from converters.delay import convert as convert_delay
    from fixtures.make_delay import make_tiny_delay_checkpoint
    from moss_tts.models.delay_tts import DelayTTS
    from moss_tts.sampling import DelaySamplingOptions

    delay = convert_delay(str(make_tiny_delay_checkpoint(tmp_path / "hf", seed=0, gen_bias=4.0)),
                          tmp_path / "delay.gguf")
    codec = tiny_codec()
    rows = [{"id": "sampled", "text": "Hello there.", "seed": 3, "max_new_rows": 24,
             "top_k": 5},
            {"id": "greedy", "text": "Hello there.", "greedy": True, "max_new_rows": 24},
            {"id": "nano-option", "text": "Hello there.", "max_frames": 10}]
    out = tmp_path / "out"
    summary = run_batch(write_jsonl(tmp_path / "m.jsonl", rows), out, model=str(delay),
                        codec=str(codec), threads=1)
    errors = {r["id"]: r["error"] for r in records(out) if r["status"] == "failed"}
    assert list(errors) == ["nano-option"] and len(summary.failed) == 1
    assert "max_frames is not a MOSS-TTS" in errors["nano-option"]
    with DelayTTS.load(delay, codec=codec, threads=1) as tts:
        sampled = tts.synthesize("Hello there.", seed=3, max_new_rows=24,
                                 options=DelaySamplingOptions(audio_top_k=5))[0]
        greedy = tts.synthesize("Hello there.", max_new_rows=24,
                                options=DelaySamplingOptions().greedy())[0]
    assert np.array_equal(read(out / "sampled.wav", channels=1), quantize(sampled, "s16"))
    assert np.array_equal(read(out / "greedy.wav", channels=1), quantize(greedy, "s16"))
    assert not np.array_equal(sampled, greedy)   # guard: the line's options reach the model


def test_a_codec_that_does_not_fit_the_model_stops_the_run_before_any_line(batch_models,
                                                                          tmp_path, tiny_codec):
    """issue 22 #9: a model/codec mismatch failed every line one by one; now one error names
    both flags and nothing is recorded (not even the line with bad input)."""
    other = tiny_codec()     # named v1.gguf
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(3) + [{"id": "bad", "text": ""}])
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"^--model \S+nano0\.gguf with --codec \S+v1\.gguf: "
                                         r"mismatched codec"):
        run_batch(manifest, out, model=str(batch_models["nano0"]), codec=str(other), threads=1,
                  workers=2)
    assert records(out) == [] and outputs(out) == {}


def test_a_missing_model_or_codec_stops_the_run_naming_its_flag(batch_models, tmp_path):
    """issue 22 #9: an unreachable --model failed each line; it is one error before any work
    (the output directory is not even made)."""
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(2))
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"^--model: \S+missing\.gguf: no such file"):
        run_batch(manifest, out, model=str(tmp_path / "missing.gguf"),
                  codec=str(batch_models["codec"]), threads=1)
    with pytest.raises(InputError, match=r"^--codec: \S+gone\.gguf: no such file"):
        run_batch(manifest, out, model=str(batch_models["nano0"]),
                  codec=str(tmp_path / "gone.gguf"), threads=1)
    assert not out.exists()
    # lines that all name a model of their own do not need --model
    own = write_jsonl(tmp_path / "own.jsonl", speech_rows(1, model=str(batch_models["nano1"])))
    summary = run_batch(own, out, model=str(tmp_path / "missing.gguf"),
                        codec=str(batch_models["codec"]), threads=1)
    assert summary.made == 1


def test_an_invalid_seed_is_recorded_as_that_failure_not_as_a_derived_seed(batch_models,
                                                                          tmp_path):
    """issue 22 #9: the record of a line with seed "soon" named derive_seed(id), and 1e30
    was accepted."""
    rows = [{"id": "huge", "text": "Hi.", "seed": 1e30}, {"id": "soon", "text": "Hi.",
                                                          "seed": "soon"}]
    out = tmp_path / "out"
    summary = run(write_jsonl(tmp_path / "m.jsonl", rows), out, batch_models)
    assert summary.made == 0
    assert {r["id"]: (r["status"], r["seed"], r["error"], r["attempts"]) for r in records(out)} == {
        "huge": ("failed", None, "seed must be at most 4294967295, got 1e+30", 1),
        "soon": ("failed", None, "seed must be a whole number, got 'soon'", 1)}


def test_switching_the_format_leaves_one_file_per_id_and_keeps_what_it_cannot_replace(
        batch_models, tmp_path):
    """issue 22 #9: a rerun with another --format left <id>.wav beside <id>.flac."""
    rows = speech_rows(2, seed=1)
    out = tmp_path / "out"
    run(write_jsonl(tmp_path / "m.jsonl", rows), out, batch_models)
    rows[1]["text"] = ""            # this line now fails: its earlier file stays
    summary = run(write_jsonl(tmp_path / "m.jsonl", rows), out, batch_models, fmt="flac")
    assert summary.made == 1 and len(summary.failed) == 1
    assert sorted(p.name for p in out.iterdir()) == ["line000.flac", "line001.wav",
                                                     "results.jsonl"]


def test_only_a_crash_that_may_pass_is_retried(batch_models, monkeypatch):
    """issue 22 #9: any exception but a MossTTSError was retried as a crash, though a
    TypeError on the same input fails the same way every time."""
    from moss_tts.batch.work import LineRunner

    runner = LineRunner(threads=1)
    model, codec = str(batch_models["nano0"]), str(batch_models["codec"])
    task = {"id": "a", "text": "Hi.", "seed": 1, "voice": None, "reference": None,
            "options": {}, "model": model, "codec": codec, "suffix": ".wav"}
    try:
        assert runner.run(task)["status"] == "ok"          # the model is loaded, and works
        tts = runner.models[(model, codec)]
        for error, retry in [(TypeError("TextInputSequence must be str"), False),
                             (InputError("text is empty"), False),
                             (MemoryError("Unable to allocate 27.2 GiB"), True)]:
            def fail(*args, error=error, **kwargs):
                raise error
            monkeypatch.setattr(tts, "synthesize", fail)
            outcome = runner.run(task)
            assert (outcome["status"], outcome["retry"]) == ("failed", retry), error
    finally:
        runner.close()


def test_each_lines_warnings_are_recorded_and_reported_with_its_id(batch_models, tmp_path):
    """issue 22 #6/#9: Nano's budget warning reached stderr without a line id and never
    reached results.jsonl."""
    heard = []
    rows = speech_rows(2) + [{"id": "empty", "text": ""}]
    out = tmp_path / "out"
    run(write_jsonl(tmp_path / "m.jsonl", rows), out, batch_models,
        warn=lambda line_id, messages: heard.append((line_id, messages)))
    by_id = {r["id"]: r["warnings"] for r in records(out)}
    assert sorted(line_id for line_id, _ in heard) == ["line000", "line001"]
    for line_id in ("line000", "line001"):
        assert len(by_id[line_id]) == 1 and "used the whole frame budget" in by_id[line_id][0]
        assert dict(heard)[line_id] == by_id[line_id]
    assert by_id["empty"] == []


def test_warnings_of_a_line_are_captured_once_each_in_order():
    import logging
    import warnings

    from moss_tts.batch.work import captured_warnings

    with captured_warnings() as messages:
        for _ in range(3):
            logging.getLogger("moss_tts.models.nano_tts").warning("chunk %d cut", 1)
        warnings.warn("budget used", UserWarning)
        warnings.warn("budget used", UserWarning)
    assert messages == ["chunk 1 cut", "budget used"]
    with captured_warnings() as many:      # e.g. one per text chunk of a long line
        for i in range(25):
            warnings.warn(f"chunk {i} cut", UserWarning)
    assert many == [f"chunk {i} cut" for i in range(10)] + ["... and 15 more warnings"]


def test_a_lines_own_model_that_does_not_load_fails_all_its_lines_after_one_try(batch_models,
                                                                               tmp_path):
    """issue 22 #9: a line's `model` that cannot load with --codec was loaded again for each of
    its lines; after the first failure the others fail at once (no work: 0 s), and the lines
    of --model still run."""
    rows = [dict(row, model=str(batch_models["codec"])) for row in speech_rows(3)]
    rows.append({"id": "good", "text": "Hi.", "max_frames": FRAMES})
    out = tmp_path / "out"
    summary = run(write_jsonl(tmp_path / "m.jsonl", rows), out, batch_models, workers=1)
    assert summary.made == 1 and len(summary.failed) == 3
    failed = [r for r in records(out) if r["status"] == "failed"]
    assert all("a 'codec' GGUF, not a speech model" in r["error"] for r in failed)
    assert sorted(r["seconds"] == 0.0 for r in failed) == [False, True, True]
    assert all(r["attempts"] == 1 for r in failed)
