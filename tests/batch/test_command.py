"""`python -m moss_tts batch` in a child process: exit status and summary, resume after a rerun,
after SIGKILL of the whole process group, and after Ctrl-C."""

import os
import signal
import time

from moss_tts.cli.batch import BatchProgress

from .conftest import batch_cli, no_partials, outputs, records, speech_rows, write_jsonl

def wait_for_records(out, n, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if (out / "results.jsonl").exists() and len(records(out)) >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {n} results before the run ended: {proc.poll()}")


def test_csv_manifest_to_flac_then_a_rerun_skips_and_an_edit_redoes_one_line(batch_models,
                                                                              tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,text,seed,max_frames\na,First line.,1,10\nb,Second line.,2,10\n"
                        "c,,3,10\n")
    out = tmp_path / "out"
    r = batch_cli(manifest, out, batch_models, "--format", "flac", "--workers", 2)
    assert r.returncode == 1                       # line c has no text
    assert "3 lines: 2 made, 0 already done, 1 failed" in r.stderr
    assert "failed c: text is missing" in r.stderr and "\r" not in r.stderr   # no TTY: no bar
    # each line's budget warning, once, with its id
    assert r.stderr.count("batch: a: warning: ") == r.stderr.count("batch: b: warning: ") == 1
    assert "used the whole frame budget" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a.flac", "b.flac", "results.jsonl"]
    first = {p: p.stat().st_mtime_ns for p in out.glob("*.flac")}

    manifest.write_text("id,text,seed,max_frames\na,First line.,1,10\nb,Second line!,2,10\n"
                        "c,Now with text.,3,10\n")
    r = batch_cli(manifest, out, batch_models, "--format", "flac", "--quiet")
    # --quiet: no progress, no summary, no warnings (results.jsonl has them, with the id)
    assert r.returncode == 0 and r.stderr == ""
    assert ["used the whole frame budget" in w for x in records(out)[-2:] for w in x["warnings"]
            ] == [True, True]
    assert (out / "a.flac").stat().st_mtime_ns == first[out / "a.flac"]      # skipped
    assert (out / "b.flac").stat().st_mtime_ns != first[out / "b.flac"]      # text changed
    assert [(x["id"], x["status"]) for x in records(out)][-2:] == [("b", "ok"), ("c", "ok")]


def test_unsafe_or_duplicate_ids_stop_before_any_work(batch_models, tmp_path):
    manifest = write_jsonl(tmp_path / "m.jsonl", speech_rows(2) + [{"id": "../up", "text": "x"}])
    r = batch_cli(manifest, tmp_path / "out", batch_models)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "m.jsonl:3: id '../up' is not a safe file name" in r.stderr
    assert not (tmp_path / "out").exists()


def long_after(n, rows):
    """`rows` with every line after the first n given hundreds of text chunks (thousands of
    frames: a deterministic amount of work), so a signal sent once n lines are recorded finds
    the workers inside long lines however fast the machine (issue 22 #11)."""
    text = " ".join(f"Sentence number {i} is here." for i in range(1000))
    return rows[:n] + [dict(row, text=text) for row in rows[n:]]


def test_sigkill_of_the_process_group_then_a_rerun_makes_every_line_exactly_once(
        batch_models, tmp_path):
    rows = speech_rows(16)
    manifest = write_jsonl(tmp_path / "m.jsonl", long_after(3, rows))
    out = tmp_path / "out"
    proc = batch_cli(manifest, out, batch_models, "--workers", 2, popen=True)
    wait_for_records(out, 3, proc)
    os.killpg(proc.pid, signal.SIGKILL)            # driver and workers at once, no clean-up
    proc.wait()
    assert len(records(out)) == 3                   # killed part-way

    r = batch_cli(write_jsonl(manifest, rows), out, batch_models, "--workers", 2)
    assert r.returncode == 0, r.stderr
    assert f"{len(rows) - 3} made, 3 already done, 0 failed" in r.stderr
    done = [x["id"] for x in records(out) if x["status"] == "ok"]
    assert sorted(done) == sorted(x["id"] for x in rows)           # every line exactly once
    assert set(outputs(out)) == {f"{x['id']}.wav" for x in rows} and no_partials(out)

    clean = tmp_path / "clean"
    assert batch_cli(manifest, clean, batch_models, "--workers", 2).returncode == 0
    assert outputs(out) == outputs(clean)          # the same seeds: the same audio


def test_ctrl_c_stops_cleanly_and_the_rerun_resumes(batch_models, tmp_path):
    """issue 22 #11: the SIGINT raced the machine (all 16 lines could be done before it came);
    now it comes while the workers are inside long lines (`long_after`)."""
    manifest = write_jsonl(tmp_path / "m.jsonl", long_after(2, speech_rows(16)))
    out = tmp_path / "out"
    proc = batch_cli(manifest, out, batch_models, "--workers", 2, popen=True)
    wait_for_records(out, 2, proc)
    os.killpg(proc.pid, signal.SIGINT)             # what Ctrl-C in a terminal sends
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"interrupted" in err and b"Traceback" not in err
    assert no_partials(out) and len(records(out)) == len(outputs(out)) == 2
    r = batch_cli(write_jsonl(manifest, speech_rows(16)), out, batch_models, "--workers", 2)
    assert r.returncode == 0 and "14 made, 2 already done, 0 failed" in r.stderr
    assert len(outputs(out)) == 16


def test_progress_shows_lines_per_second_audio_per_wall_second_and_eta(capsys, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    bar = BatchProgress(quiet=False)
    bar(5, 20, 12.5, 2.5)
    bar.close()
    assert capsys.readouterr().err == ("\rbatch: 5/20 lines, 2.00 lines/s, 5.00 audio s/s, "
                                       "ETA 0:08   \n")
    quiet = BatchProgress(quiet=True)
    quiet(5, 20, 12.5, 2.5)
    assert capsys.readouterr().err == ""
