"""`batch --streams N` (issue 25): each worker decodes up to N lines together in one running
batch (work.LineFeed, NanoTTS.decoding_together), the next line joining as one ends (issue 33).
Each line's audio, record and warnings equal the same manifest
run one line at a time (the reference: `--streams 1`, i.e. NanoTTS.synthesize per line, which
test_driver.py pins to the model's synthesis for the line's seed); a bad line fails alone; a
family without a batched decoder is one error before any line runs."""

import contextlib
import functools
import io

import numpy as np
import pytest
import soundfile as sf

from moss_tts.batch import run_batch
from moss_tts.batch.driver import Job
from moss_tts.batch.ledger import Ledger
from moss_tts.batch.manifest import read_manifest
from moss_tts.batch.work import LineFeed, LineRunner
from moss_tts.errors import InputError
from moss_tts.models.nano_tts import NanoTTS

from .conftest import FRAMES, batch_cli, no_partials, outputs, records, write_jsonl

LONG = "Hello there, a long sentence with many words in it to say."
STALL = "stopping: 50 identical frames in a row"
# max_frames differ, so each line's frame-budget warning has its own text (a warning heard in
# another line's pull, or pooled for the batch, would show up on the wrong line)
GOOD = [{"id": "a", "text": "Hello there.", "seed": 11, "max_frames": FRAMES},
        {"id": "b", "text": "Another sentence, a longer one.", "max_frames": FRAMES - 2},
        {"id": "voice", "text": "Hello there.", "seed": 5, "max_frames": FRAMES + 2,
         "voice": "alice"},
        {"id": "greedy", "text": "Hello there.", "greedy": True, "max_frames": FRAMES - 4},
        {"id": "sampled", "text": "Two chunks. Of text here.", "seed": 3, "max_frames": FRAMES,
         "temperature": 0.5, "top_k": 5, "max_text_tokens": 4},
        # greedy on the tiny model repeats one frame: "stalls" stops on 50 identical frames in a
        # step run in the pull of "long" (sampled, still going), which must not hear its warning
        {"id": "long", "text": LONG, "seed": 2, "max_frames": 200},
        {"id": "stalls", "text": LONG, "greedy": True, "max_frames": 200},
        {"id": "other-model", "text": "Hello there.", "seed": 11, "max_frames": FRAMES}]
# each fails in another place: in the worker's knob check, its voice, and its synthesis
BAD = [{"id": "delay-knob", "text": "Hi.", "max_new_rows": 10},
       {"id": "nobody", "text": "Hi.", "voice": "bob"},
       {"id": "empty", "text": ""}]


def manifest_rows(models):
    rows = [dict(r) for r in GOOD]
    rows[-1]["model"] = str(models["nano1"])
    # bad lines between good ones, so each batch of 3 holds one
    return rows[:1] + BAD[:1] + rows[1:3] + BAD[1:2] + rows[3:] + BAD[2:]


def run(manifest, out, models, **kw):
    return run_batch(manifest, out, model=str(models["nano0"]), codec=str(models["codec"]),
                     threads=1, **kw)


def by_id(out):
    keep = ("status", "error", "warnings", "duration", "seed", "model_sha256", "attempts")
    return {r["id"]: {k: r[k] for k in keep} for r in records(out)}


def test_streams_3_makes_each_lines_audio_record_and_warnings_as_streams_1(
        batch_models, voice_env, tmp_path, monkeypatch):
    monkeypatch.setenv("MOSS_TTS_VOICES", str(voice_env["root"]))
    manifest = write_jsonl(tmp_path / "m.jsonl", manifest_rows(batch_models))
    alone, together = tmp_path / "alone", tmp_path / "together"
    s1 = run(manifest, alone, batch_models, workers=1)
    s3 = run(manifest, together, batch_models, workers=1, streams=3)
    assert (s1.made, len(s1.failed)) == (s3.made, len(s3.failed)) == (len(GOOD), len(BAD))
    assert outputs(together) == outputs(alone) and no_partials(together)
    assert set(outputs(together)) == {f"{r['id']}.wav" for r in GOOD}
    assert by_id(together) == by_id(alone)
    errors = {k: v["error"] for k, v in by_id(together).items() if v["status"] == "failed"}
    assert "max_new_rows is not a MOSS-TTS-Nano" in errors["delay-knob"]
    assert "no voice named 'bob'" in errors["nobody"] and errors["empty"] == "text is empty"
    # every good line ran to its own budget: one warning each, naming that budget; the stall
    # is the stalled line's alone
    assert by_id(together)["stalls"]["warnings"] == [STALL]
    assert STALL not in by_id(together)["long"]["warnings"]
    for row in GOOD:
        if row["id"] in ("long", "stalls"):
            continue
        (warning,) = by_id(together)[row["id"]]["warnings"]
        assert f"({row['max_frames']} frames" in warning, (row["id"], warning)
    # guard: the lines differ, so equal files are not one line's audio everywhere
    assert len(set(outputs(together).values())) == len(GOOD)


def samples(outcome):
    return sf.read(io.BytesIO(outcome["audio"]), dtype="int16")[0]


def tasks_of(rows, tmp_path, models):
    """The manifest rows as a worker gets them (driver.Job), all on the first Nano model."""
    with Ledger(tmp_path / "out") as ledger:
        job = Job(ledger, suffix=".wav", retries=0)
        for line in read_manifest(write_jsonl(tmp_path / "m.jsonl", rows)):
            job.add(line, model=str(models["nano0"]), model_sha256="0", model_error=None,
                    codec=str(models["codec"]), codec_sha256="0")
        return job.take(len(rows))


def fed(runner, tasks, streams):
    """LineFeed.run's outcomes, in the order of `tasks` (the feed's batch closed after)."""
    feed = LineFeed(runner, streams)
    try:
        made = {outcome["id"]: outcome for outcome in feed.run(tasks)}
    finally:
        feed.close()
    return [made[task["id"]] for task in tasks]


def test_a_worker_decodes_its_lines_in_one_batched_call(batch_models, voice_env, tmp_path,
                                                        monkeypatch):
    """LineFeed: the good lines of one model join one batch (its decoding_together); a line
    whose knobs or voice fail never joins it, and one whose synthesis fails (empty text: its
    stream refuses it as it is made) fails alone while the others are made."""
    monkeypatch.setenv("MOSS_TTS_VOICES", str(voice_env["root"]))
    calls = []      # one entry per batch opened: ([texts of the streams made in it], streams)
    together_, stream_ = NanoTTS.decoding_together, NanoTTS.stream

    @contextlib.contextmanager
    def spy_together(self, max_streams):
        calls.append(([], max_streams))
        with together_(self, max_streams) as batch:
            yield batch

    @functools.wraps(stream_)     # its signature: the registry reads the family's keywords
    def spy_stream(self, text, **kw):
        if self._batch is not None:
            calls[-1][0].append(text)
        return stream_(self, text, **kw)

    monkeypatch.setattr(NanoTTS, "decoding_together", spy_together)
    monkeypatch.setattr(NanoTTS, "stream", spy_stream)
    rows = [GOOD[0], BAD[0], GOOD[1], BAD[1], GOOD[2]]
    tasks = tasks_of(rows, tmp_path, batch_models)
    runner = LineRunner(1)
    try:
        together = fed(runner, tasks, 3)
        assert calls == [([GOOD[0]["text"], GOOD[1]["text"], GOOD[2]["text"]], 3)]
        alone = [runner.run(task) for task in tasks]
        calls.clear()
        with_empty = fed(runner, [tasks[0], dict(tasks[1], text="", options={})], 2)
    finally:
        runner.close()
    assert [o["status"] for o in together] == ["ok", "failed", "ok", "failed", "ok"]
    for got, want in zip(together, alone):
        assert (got["status"], got.get("error"), got["warnings"]) == \
            (want["status"], want.get("error"), want["warnings"])
        if got["status"] == "ok":
            assert np.array_equal(samples(got), samples(want)), got["id"]
    assert len(calls) == 1        # one batch, which the empty line never joined
    assert [o["status"] for o in with_empty] == ["ok", "failed"]
    assert with_empty[1]["error"] == "text is empty"
    assert np.array_equal(samples(with_empty[0]), samples(alone[0]))


# a long line and short ones: the long one runs to its budget (one text chunk of 68 tokens),
# each short one 3 frames
LONGER = f"{LONG} {LONG}"
BESIDE_LONG = [{"id": "long", "text": LONGER, "seed": 2, "max_frames": 1200}] + [
    {"id": f"short{i}", "text": "Hello there.", "seed": i, "max_frames": 3} for i in range(4)]


def test_a_long_line_holds_only_its_own_place(batch_models, tmp_path):
    """issue 33: `--streams 2` took two lines and waited for both before taking the next two,
    so a long line held its partner's place to its end (the ledger read long, short0, short1,
    short2, short3: short0 came back with long, the others after it). Now the next line joins
    as soon as one ends: every short line is made while the long one still runs (1200 frames
    beside 4 × 3), each as it is alone."""
    manifest = write_jsonl(tmp_path / "m.jsonl", BESIDE_LONG)
    made = {}
    for streams in (1, 2):
        out = tmp_path / f"streams{streams}"
        summary = run(manifest, out, batch_models, workers=1, streams=streams)
        assert summary.made == len(BESIDE_LONG) and not summary.failed
        made[streams] = outputs(out)
    assert [r["id"] for r in records(tmp_path / "streams2")] == \
        ["short0", "short1", "short2", "short3", "long"]
    assert made[2] == made[1] and len(set(made[1].values())) == len(BESIDE_LONG)


def test_the_next_line_joins_the_running_batch_as_soon_as_a_place_frees(batch_models, tmp_path,
                                                                          monkeypatch):
    """LineFeed with 2 places, counted through its pulls: the long line stays in flight from
    the first pull to the last, and each short line joins it the round after the one before
    it ended, so no place stands empty while a line waits; each line's audio as alone."""
    flights = []
    advance = LineFeed.advance

    def counted(self):
        flights.append([line.task["id"] for line in self.flying])
        return advance(self)

    monkeypatch.setattr(LineFeed, "advance", counted)
    tasks = tasks_of(BESIDE_LONG, tmp_path, batch_models)
    runner = LineRunner(1)
    try:
        feed = LineFeed(runner, 2)
        try:
            made = list(feed.run(tasks))
        finally:
            feed.close()
        alone = {task["id"]: samples(runner.run(task)) for task in tasks}
    finally:
        runner.close()
    assert [outcome["id"] for outcome in made] == ["short0", "short1", "short2", "short3", "long"]
    # each short line is pulled 3 times for its frames and once more for its end, beside long
    shorts = 4 * 4
    assert flights[:shorts] == [["long", f"short{i}"] for i in range(4) for _ in range(4)]
    assert flights[shorts:] == [["long"]] * (len(flights) - shorts)
    assert len(flights) > shorts + 300      # guard: the long line outlived them by far
    for outcome in made:
        assert np.array_equal(samples(outcome), alone[outcome["id"]]), outcome["id"]


def test_a_pull_that_fails_runs_each_line_of_its_batch_alone(batch_models, tmp_path,
                                                             monkeypatch):
    """A pull that fails names no line (a step advances every line of its batch): the batch
    ends and each of its lines runs alone, so only the bad one fails (here a line whose prompt
    fails as its first frame is pulled, alone too); the next line opens a new batch."""
    prompt_rows = NanoTTS.prompt_rows

    def failing(self, chunk, **kw):
        if "Broken" in chunk:
            raise InputError("this prompt breaks")
        return prompt_rows(self, chunk, **kw)

    batches = []
    together_ = NanoTTS.decoding_together

    def counted(self, max_streams):
        batches.append(max_streams)
        return together_(self, max_streams)

    monkeypatch.setattr(NanoTTS, "prompt_rows", failing)
    monkeypatch.setattr(NanoTTS, "decoding_together", counted)
    rows = [GOOD[0], {"id": "broken", "text": "Broken words.", "max_frames": FRAMES}, GOOD[1]]
    tasks = tasks_of(rows, tmp_path, batch_models)
    runner = LineRunner(1)
    try:
        together = fed(runner, tasks, 2)
        alone = [runner.run(task) for task in tasks]
    finally:
        runner.close()
    assert batches == [2, 2]        # the first ended by the failed pull, the second for GOOD[1]
    assert [o["status"] for o in together] == ["ok", "failed", "ok"]
    assert together[1]["error"] == alone[1]["error"] == "this prompt breaks"
    for got, want in zip(together, alone):
        assert got["warnings"] == want["warnings"]
        if got["status"] == "ok":
            assert np.array_equal(samples(got), samples(want)), got["id"]


def test_streams_with_a_family_that_decodes_one_stream_is_one_error_before_any_line(
        batch_models, tmp_path, monkeypatch):
    """Every token family has a batched decoder (the registry says so; MOSS-SoundEffect v2.0's
    diffusion sampler decodes one request at a time); one without — here Realtime with its
    BATCHED taken away — is refused before any line runs, by its name, and a line's own model
    counts too."""
    from converters.realtime import convert as convert_realtime
    from fixtures.make_realtime import make_tiny_realtime_checkpoint
    from moss_tts.models.realtime_tts import RealtimeTTS
    from moss_tts.models.registry import FAMILIES

    assert [f.kind for f in FAMILIES if f.tts_class().BATCHED is None] == ["sfx-v2"]
    one = convert_realtime(str(make_tiny_realtime_checkpoint(tmp_path / "hf", seed=0)),
                           tmp_path / "realtime.gguf")
    monkeypatch.setattr(RealtimeTTS, "BATCHED", None)
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "a", "text": "Hello there."}])
    with pytest.raises(InputError, match=r"^--streams 2: MOSS-TTS-Realtime .* decodes one line "
                       r"at a time; --streams > 1 takes MOSS-TTS-Nano or .* models only") as e:
        run_batch(manifest, tmp_path / "out", model=one, codec=str(batch_models["codec"]),
                  threads=1, streams=2)
    assert "\n" not in str(e.value) and "or MOSS-TTS-Realtime" not in str(e.value)
    assert not (tmp_path / "out").exists()
    # a line's own model counts too, with a Nano --model
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{"id": "a", "text": "Hi."},
                                                   {"id": "b", "text": "Hi.", "model": str(one)}])
    with pytest.raises(InputError, match=r"^--streams 3: MOSS-TTS-Realtime"):
        run(mixed, tmp_path / "out", batch_models, streams=3)
    with pytest.raises(InputError, match="--streams ≥ 1"):
        run(mixed, tmp_path / "out", batch_models, streams=0)
    assert not (tmp_path / "out").exists()


def test_streams_auto_is_what_serve_gives_the_lines_models(batch_models, tmp_path,
                                                           monkeypatch):
    """`--streams auto` (None), as serve's --max-streams auto: MAX_STREAMS lines a worker where
    every model the lines use has a batched decoder, one where one of them has none."""
    from moss_tts.batch import local
    from moss_tts.cli import build_parser
    from moss_tts.models.batching import MAX_STREAMS

    args = build_parser().parse_args(["batch", "m.jsonl", "-o", "out", "--streams", "auto"])
    assert args.streams is None
    given = []
    monkeypatch.setattr(local, "run_local",
                        lambda job, n, threads, streams, backend: given.append(streams))
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi."}])
    run(manifest, tmp_path / "batched", batch_models, streams=None)
    monkeypatch.setattr(NanoTTS, "BATCHED", None)
    run(manifest, tmp_path / "lone", batch_models, streams=None)
    assert given == [MAX_STREAMS, 1] and MAX_STREAMS > 1


def batch_help(capsys) -> str:
    from moss_tts.cli import main

    with pytest.raises(SystemExit):
        main(["batch", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_streams_help_names_the_families_the_registry_says_decode_together(capsys,
                                                                           monkeypatch):
    """issue 31 (finding 10): the help said "MOSS-TTS-Nano only so far" while every family took
    --streams; it is read from the registry (Family.batched), as check_streams' error is."""
    from moss_tts.models.realtime_tts import RealtimeTTS

    text = batch_help(capsys)
    assert "Nano only" not in text and ("with Nano, Delay, TTSD, VoiceGenerator, SoundEffect, "
                                        "Local, Local v1.5, Realtime models only") in text
    monkeypatch.setattr(RealtimeTTS, "BATCHED", None)
    assert ("with Nano, Delay, TTSD, VoiceGenerator, SoundEffect, Local, Local v1.5 "
            "models only; default 1") in batch_help(capsys)


@pytest.fixture(scope="module")
def qwen3_models(tmp_path_factory, tiny_codec):
    """family → (model GGUF, codec GGUF): the tiny Local and Local v1.5 models that speak past
    the lines' budgets, with the codecs they decode through."""
    from converters.local import convert as convert_local
    from converters.local_v15 import convert as convert_v15
    from fixtures.make_local import make_tiny_local_checkpoint
    from fixtures.make_local_v15 import make_tiny_local_v15_checkpoint

    d = tmp_path_factory.mktemp("qwen3_streams")
    local = convert_local(str(make_tiny_local_checkpoint(d / "local", seed=1, speech=True)),
                          d / "local.gguf")
    v15 = convert_v15(str(make_tiny_local_v15_checkpoint(d / "v15", continue_bias=6.0)),
                      d / "v15.gguf")
    return {"local": (local, tiny_codec()), "local_v15": (v15, tiny_codec("v2"))}


@pytest.mark.parametrize("family", ["local", "local_v15"])
def test_streams_4_makes_the_issues_eight_lines_as_streams_1(qwen3_models, family, tmp_path):
    """issue 31 (finding 1): an 8-line manifest, each line its own seed and budget, run 4 lines
    at a time against one at a time — every file bit-equal (MOSS-TTS-Local's line 6 differed
    at full scale, Local v1.5's by 1 LSB on 2 of 8 lines, with the default f16 KV cache)."""
    model, codec = qwen3_models[family]
    rows = [{"id": f"line{i}", "text": f"Sentence number {i}.", "seed": i, "max_frames": 8 + i}
            for i in range(8)]
    manifest = write_jsonl(tmp_path / "m.jsonl", rows)
    made = {}
    for streams in (1, 4):
        out = tmp_path / f"streams{streams}"
        summary = run_batch(manifest, out, model=str(model), codec=str(codec), threads=1,
                            workers=1, streams=streams)
        assert summary.made == 8 and not summary.failed
        made[streams] = {p.name: sf.read(p, dtype="int16")[0].tobytes()
                         for p in sorted(out.glob("*.wav"))}
    assert len(made[1]) == 8 and made[4] == made[1]
    assert len(set(made[1].values())) == 8            # guard: eight different lines
