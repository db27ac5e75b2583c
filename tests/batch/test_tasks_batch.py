"""The batch command with MossTTSDelay's other published checkpoints (tiny MOSS-TTSD,
MOSS-VoiceGenerator and MOSS-SoundEffect through the real converter, one codec): a `speakers`
column (stored voices, speech files relative to the manifest, with transcripts), a `sound`
column with no text, `instruction` for the designed voice; each line's audio is the API's for
its seed, and a bad value fails that line only, with its id."""

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_delay import SAMPLE_RATE, make_tiny_published_models
from moss_tts.audio import quantize
from moss_tts.batch import run_batch
from moss_tts.models.registry import family_of_model
from moss_tts.voices import add_voice

from .conftest import read, records, write_jsonl

ROWS = 20          # the tiny models rarely end by themselves: rows are capped
DIALOGUE = "[S1] Hello there. [S2] Fine, thanks."
KINDS = ("ttsd", "voicegen", "sfx")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    made = make_tiny_published_models(tmp_path_factory.mktemp("batch_tasks"), KINDS)
    return {key: str(path) for key, path in made.items()}


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A manifest directory with a speech file, and a stored voice 'bob' with its transcript."""
    monkeypatch.setenv("MOSS_TTS_VOICES", str(tmp_path / "voices"))
    t = np.arange(int(0.5 * SAMPLE_RATE)) / SAMPLE_RATE
    (tmp_path / "refs").mkdir()
    sf.write(tmp_path / "refs" / "alice.wav",
             (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), SAMPLE_RATE)
    add_voice("bob", np.random.default_rng(4).integers(0, 64, size=(6, 8)),
              {"transcript": "Bob speaking."})
    return tmp_path


def api(files, kind, *args, **kw):
    with family_of_model(files[kind]).tts_class().load(files[kind], codec=files["codec"],
                                                       threads=1) as tts:
        kw = {k: (v(tts) if callable(v) else v) for k, v in kw.items()}
        return quantize(tts.synthesize(*args, seed=7, max_new_rows=ROWS, **kw)[0], "s16")


def run(files, corpus, rows, name="m.jsonl"):
    manifest = corpus / name
    if name.endswith(".csv"):
        manifest.write_text(rows)
    else:
        write_jsonl(manifest, rows)
    out = corpus / "out"
    run_batch(manifest, out, model=files["ttsd"], codec=files["codec"], threads=1)
    return out, {r["id"]: r for r in records(out)}


def test_each_task_column_makes_the_apis_audio(files, corpus):
    alice = corpus / "refs" / "alice.wav"
    common = {"seed": 7, "max_new_rows": ROWS}
    out, done = run(files, corpus, [
        {"id": "dialogue", "text": DIALOGUE, **common, "speakers": [
            {"reference": "refs/alice.wav", "transcript": "Alice speaking."}, {"voice": "bob"}]},
        {"id": "designed", "model": files["voicegen"], "text": "Hello there.",
         "instruction": "A calm, low voice.", **common},
        {"id": "rain", "model": files["sfx"], "sound": "Rain on a tin roof.", "seconds": 1,
         **common}])
    assert {i: r["status"] for i, r in done.items()} == dict.fromkeys(
        ("dialogue", "designed", "rain"), "ok"), done
    speech = sf.read(alice, dtype="float32", always_2d=True)
    np.testing.assert_array_equal(read(out / "dialogue.wav", channels=1), api(
        files, "ttsd", DIALOGUE, speakers=lambda tts: [(speech, "Alice speaking."),
                                                       tts.voice("bob")]))
    np.testing.assert_array_equal(read(out / "designed.wav", channels=1), api(
        files, "voicegen", "Hello there.", instruction="A calm, low voice."))
    np.testing.assert_array_equal(read(out / "rain.wav", channels=1), api(
        files, "sfx", None, sound="Rain on a tin roof.", seconds=1))


def test_a_bad_task_value_fails_its_line_only_naming_the_column(files, corpus):
    alice = {"reference": "refs/alice.wav", "transcript": "Alice speaking."}
    out, done = run(files, corpus, [
        {"id": "good", "text": "[S1] Hi.", "speakers": [alice], "max_new_rows": ROWS},
        # a speaker given no voice is the model's choice (upstream's app leaves S2 to it)
        {"id": "s2-left", "text": "[S1] Hi. [S2] Yo.", "speakers": [alice],
         "max_new_rows": ROWS},
        {"id": "no-transcript", "text": "[S1] Hi.", "speakers": [{"reference": "refs/alice.wav"}]},
        {"id": "not-a-list", "text": "[S1] Hi.", "speakers": {"voice": "bob"}},
        {"id": "six", "text": "[S1] Hi.", "speakers": [{"voice": "bob"}] * 6},
        {"id": "unknown-voice", "text": "[S1] Hi.", "speakers": [{"voice": "nobody"}]},
        {"id": "voice-column", "text": "[S1] Hi.", "voice": "bob"},
        {"id": "no-instruction", "model": files["voicegen"], "text": "Hello."},
        {"id": "sfx-speakers", "model": files["sfx"], "sound": "Rain.", "speakers": [alice]},
        {"id": "sound-and-text", "model": files["sfx"], "sound": "Rain.", "text": "Rain.",
         "max_new_rows": ROWS},
        {"id": "no-text", "max_new_rows": ROWS}])
    errors = {i: r["error"] for i, r in done.items() if r["status"] == "failed"}
    assert set(done) - set(errors) == {"good", "s2-left"}
    assert all("\n" not in e for e in errors.values())
    want = {
        "no-transcript": "speakers: speaker 1's reference needs its transcript",
        "not-a-list": "speakers must be a list",
        "six": "speakers has 6 speakers; at most 5",
        "unknown-voice": "no voice named 'nobody'",
        "voice-column": "voice is not a MOSS-TTSD v1.0 option; give each speaker's "
                        "in the speakers column",
        "no-instruction": "instruction is required for MOSS-VoiceGenerator",
        "sfx-speakers": "speakers is not a MOSS-SoundEffect option",
        "sound-and-text": "not both",
        "no-text": "text is missing",
    }
    for line, message in want.items():
        assert message in errors[line], (line, errors[line])


def test_a_csv_speakers_cell_is_json(files, corpus):
    out, done = run(files, corpus, 'id,text,speakers,max_new_rows,seed\n'
                    'a,[S1] Hi.,"[{""voice"": ""bob""}]",20,7\n'
                    'b,[S1] Hi.,not json,20,7\n', name="m.csv")
    assert done["a"]["status"] == "ok"
    assert done["b"]["status"] == "failed"
    assert done["b"]["error"].startswith("speakers must be a JSON list")
    np.testing.assert_array_equal(read(out / "a.wav", channels=1), api(
        files, "ttsd", "[S1] Hi.", speakers=lambda tts: [tts.voice("bob")]))
