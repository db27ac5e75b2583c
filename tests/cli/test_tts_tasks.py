"""`tts`, `voice add` and `info` with MossTTSDelay's other published checkpoints (tiny
MOSS-TTSD, MOSS-VoiceGenerator and MOSS-SoundEffect through the real converter): the audio of
each front-end flag equals the API's for the same seed, and each bad input is one line naming
its flag."""

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_delay import SAMPLE_RATE, make_tiny_published_models
from moss_tts.audio import REFERENCE_MAX_SECONDS, read_audio
from moss_tts.cli import main
from moss_tts.models.registry import family_of_model
from moss_tts.voices import load_voice

ROWS = 20          # the tiny models rarely end by themselves: rows are capped
DIALOGUE = "[S1] Hello there. [S2] Fine, thanks."


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tts_tasks")
    out = make_tiny_published_models(d)
    t = np.arange(int(0.5 * SAMPLE_RATE)) / SAMPLE_RATE
    for name, hz in (("alice", 220), ("bob", 150)):
        out[name] = d / f"{name}.wav"
        sf.write(out[name], (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), SAMPLE_RATE)
    return out


@pytest.fixture
def voices(tmp_path, monkeypatch):
    """A voices directory of the test's own, for child processes and this one."""
    root = tmp_path / "voices"
    monkeypatch.setenv("MOSS_TTS_VOICES", str(root))
    return root


def cli(*args):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                          capture_output=True, env=dict(os.environ))


def tts_args(files, kind, *extra):
    return ("tts", "--model", files[kind], "--codec", files["codec"], "--seed", 7,
            "--max-new-rows", ROWS, "--threads", 1, "--sample-format", "f32", *extra)


def api(files, kind, *args, **kw):
    with family_of_model(files[kind]).tts_class().load(files[kind], codec=files["codec"],
                                                       threads=1) as tts:
        kw = {k: (v(tts) if callable(v) else v) for k, v in kw.items()}
        return tts.synthesize(*args, seed=7, max_new_rows=ROWS, **kw)[0]


def made(path):
    return sf.read(path, dtype="float32", always_2d=True)[0]


def one_line_error(capsys, *args) -> str:
    assert main([str(a) for a in args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_voice_design_from_the_cli_equals_the_api(files, tmp_path):
    out = tmp_path / "vg.wav"
    r = cli(*tts_args(files, "voicegen", "--text", "Hello there.", "--instruction",
                      "A calm, low voice.", "-o", out))
    assert r.returncode == 0, r.stderr
    want = api(files, "voicegen", "Hello there.", instruction="A calm, low voice.")
    np.testing.assert_array_equal(made(out), want)


def test_a_sound_from_the_cli_needs_no_text_and_equals_the_api(files, tmp_path):
    out = tmp_path / "sfx.wav"
    r = cli(*tts_args(files, "sfx", "--sound", "Rain on a tin roof.", "--seconds", 1, "-o",
                      out))
    assert r.returncode == 0, r.stderr
    want = api(files, "sfx", None, sound="Rain on a tin roof.", seconds=1)
    np.testing.assert_array_equal(made(out), want)


def test_a_dialogue_from_a_file_with_a_file_and_a_stored_voice_equals_the_api(files, tmp_path,
                                                                              voices):
    """--speaker 1=FILE:TRANSCRIPT and --speaker 2=VOICE (stored with `voice add --transcript`):
    the speech read as the API's (samples, rate) and the stored voice with its transcript."""
    r = cli("voice", "add", "bob", files["bob"], "--codec", files["codec"], "--transcript",
            "Bob speaking.")
    assert r.returncode == 0, r.stderr
    assert load_voice("bob")[0].transcript == "Bob speaking."
    text = tmp_path / "dialogue.txt"
    text.write_text(DIALOGUE)
    out = tmp_path / "ttsd.wav"
    r = cli(*tts_args(files, "ttsd", "--text-file", text, "--speaker",
                      f"1={files['alice']}:Alice: speaking.", "--speaker", "2=bob", "-o", out))
    assert r.returncode == 0, r.stderr
    alice = read_audio(files["alice"], max_seconds=REFERENCE_MAX_SECONDS)
    want = api(files, "ttsd", DIALOGUE,
               speakers=lambda tts: [(alice, "Alice: speaking."), tts.voice("bob")])
    np.testing.assert_array_equal(made(out), want)
    plain = api(files, "ttsd", DIALOGUE)
    assert want.shape != plain.shape or not np.array_equal(want, plain)   # the voices matter


@pytest.mark.parametrize("given", [1, 2])
def test_a_speaker_without_a_speaker_flag_is_the_models_choice(files, tmp_path, given):
    """Upstream's TTSD app clones S1 and leaves S2 to the model: `--speaker 1=...` alone with
    [S2] in the dialogue speaks (as `--speaker 2=...` alone with [S1] did), equal to the API's
    speakers list with None for the other."""
    out = tmp_path / "ttsd.wav"
    r = cli(*tts_args(files, "ttsd", "--text", DIALOGUE, "--speaker",
                      f"{given}={files['alice']}:Alice speaking.", "-o", out))
    assert r.returncode == 0, r.stderr
    alice = read_audio(files["alice"], max_seconds=REFERENCE_MAX_SECONDS)
    speakers = [None, None]
    speakers[given - 1] = (alice, "Alice speaking.")
    np.testing.assert_array_equal(made(out), api(files, "ttsd", DIALOGUE, speakers=speakers))


@pytest.mark.parametrize("kind, extra, message", [
    ("voicegen", ("--text", "Hi."), "--instruction is required for MOSS-VoiceGenerator"),
    ("voicegen", ("--text", "Hi.", "--instruction", "Calm.", "--sound", "rain"),
     "--sound is not a MOSS-VoiceGenerator option: it describes a sound for MOSS-SoundEffect "
     "(--model OpenMOSS-Team/MOSS-SoundEffect) or MOSS-SoundEffect-v2.0 (--model "
     "OpenMOSS-Team/MOSS-SoundEffect-v2.0); MOSS-VoiceGenerator speaks a text: leave out "
     "--sound\n"),
    ("voicegen", ("--sound", "rain", "--instruction", "Calm."),
     "MOSS-VoiceGenerator speaks a text: leave out --sound and give --text\n"),
    ("sfx", ("--text", "Hi.", "--sound", "rain"), "--sound describes the sound instead of a "
                                                 "text: leave out --text"),
    ("sfx", ("--text", "[S1] Hi.", "--speaker", "1=bob"), "--speaker is not a MOSS-SoundEffect "
                                                          "option"),
    ("ttsd", ("--text", "[S1] Hi.", "--voice", "bob"), "--voice is not a MOSS-TTSD v1.0 "
                                                        "option: give each speaker's voice"),
    ("ttsd", ("--text", "[S1] Hi.", "--speaker", "1=nobody"),
     "--speaker 1=nobody: no such file, and no voice named 'nobody'"),
    ("ttsd", ("--text", "[S1] Hi.", "--speaker", "1=bob", "--speaker", "1=bob"),
     "--speaker 1 is given twice"),
])
def test_bad_task_flags_are_one_line_before_the_model_loads(files, tmp_path, capsys, voices,
                                                            kind, extra, message):
    out = tmp_path / "o.wav"
    err = one_line_error(capsys, "tts", "--model", files[kind], "--codec", files["codec"],
                         "-o", out, *extra)
    assert message in err
    assert not out.exists()


def test_a_speaker_voice_without_a_transcript(files, tmp_path, capsys, voices):
    assert main(["voice", "add", "carol", str(files["alice"]), "--codec",
                 str(files["codec"])]) == 0
    capsys.readouterr()
    out = tmp_path / "o.wav"
    base = ("tts", "--model", files["ttsd"], "--codec", files["codec"], "-o", out,
            "--max-new-rows", 4)
    err = one_line_error(capsys, *base, "--text", "[S1] Hi.", "--speaker", "1=carol")
    assert "--speaker 1=carol: the voice has no stored transcript" in err
    assert not out.exists()


def test_the_advice_for_a_sound_given_to_the_voice_designer_works_when_followed(files, tmp_path,
                                                                              capsys):
    """`tts --sound` on MOSS-VoiceGenerator said "leave it out, or use a model of a family that
    takes it": left out, the command had no text (whose own error offered --sound again) and
    no --instruction. The advice is now the flags the model needs, and following it speaks."""
    out = tmp_path / "o.wav"
    base = ("tts", "--model", files["voicegen"], "--codec", files["codec"], "-o", out,
            "--max-new-rows", 4)
    err = one_line_error(capsys, *base, "--sound", "rain on a roof")
    advice = "leave out --sound and give --text and --instruction, a description of the voice"
    assert advice in err and "MOSS-SoundEffect (--model OpenMOSS-Team/MOSS-SoundEffect)" in err
    assert main([str(a) for a in (*base, "--text", "rain on a roof", "--instruction",
                                  "A calm voice.")]) == 0
    assert made(out).size > 0
    # the other way it offers: a MOSS-SoundEffect model takes the --sound as given
    assert main([str(a) for a in ("tts", "--model", files["sfx"], "--codec", files["codec"],
                                  "-o", out, "--max-new-rows", 4, "--sound",
                                  "rain on a roof")]) == 0


@pytest.mark.parametrize("tag", ["[S-1]", "[S0]", "[S6]", "[S01]"])
def test_a_dialogue_tag_outside_s1_to_s5_is_one_line_naming_it(files, tmp_path, capsys, tag):
    """[S-1] was spoken as [S1] (the cleanup dropped its `-`), [S01] passed as speaker 1."""
    out = tmp_path / "o.wav"
    err = one_line_error(capsys, "tts", "--model", files["ttsd"], "--codec", files["codec"],
                         "-o", out, "--max-new-rows", 4, "--text", f"[S1] Hi. {tag} Yo.")
    assert err == (f"error: the text has the speaker tag {tag}: MOSS-TTSD's speaker tags are "
                   "[S1] to [S5]; fix the tag\n")
    assert not out.exists()


@pytest.mark.parametrize("value, message", [
    ("1={alice}", "a reference file needs its transcript after ':'"),
    ("6={alice}:Hi.", "speakers are 1 to 5"),
    ("0=bob", "speakers are 1 to 5"),
    ("bob", "write N=SRC[:TRANSCRIPT]"),
    ("1=../x:Hi.", "1=../x: no such file, and not a stored voice's name"),
])
def test_a_malformed_speaker_flag_is_one_line_naming_it(files, capsys, value, message):
    with pytest.raises(SystemExit) as e:
        main(["tts", "--model", str(files["ttsd"]), "--text", "[S1] Hi.", "-o", "o.wav",
              "--speaker", value.format(alice=files["alice"])])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "argument --speaker" in err, err
    assert message in err


def test_a_designed_voice_is_the_codecs_encoding_of_the_apis_sample(files, voices):
    """`voice add --from-description`: the sample the API speaks for the description, encoded
    at all the codec's codebooks (more than the designer's 2), stored with its text as the
    transcript and the description as the source; a stored designed voice speaks in TTSD."""
    r = cli("voice", "add", "calm", "--from-description", "A calm, low voice.", "--model",
            files["voicegen"], "--codec", files["codec"], "--seed", 3, "--max-new-rows", ROWS,
            "--text", "A short sample.")
    assert r.returncode == 0, r.stderr
    assert "voice calm:" in r.stderr.decode() and "designed" in r.stderr.decode()
    ref, info = load_voice("calm")
    with family_of_model(files["voicegen"]).tts_class().load(
            files["voicegen"], codec=files["codec"], threads=1) as tts:
        sample, sr = tts.synthesize("A short sample.", instruction="A calm, low voice.", seed=3,
                                    max_new_rows=ROWS)
        want = tts.codec.encode(sample, sr).T
        assert want.shape[1] == tts.codec.n_quantizers > tts.config.n_vq
    np.testing.assert_array_equal(ref.codes, want)
    assert ref.transcript == "A short sample." and info["source"].endswith("A calm, low voice.")
    r = cli(*tts_args(files, "ttsd", "--text", "[S1] Hi.", "--speaker", "1=calm", "-o",
                      voices.parent / "d.wav"))
    assert r.returncode == 0, r.stderr


def test_voice_add_from_a_description_refuses_a_model_that_is_not_a_voice_designer(files,
                                                                                  capsys,
                                                                                  voices):
    err = one_line_error(capsys, "voice", "add", "x", "--from-description", "calm", "--model",
                         files["sfx"], "--codec", files["codec"])
    assert "--from-description needs a voice-design model (MOSS-VoiceGenerator)" in err
    assert "MOSS-SoundEffect one" in err
    err = one_line_error(capsys, "voice", "add", "x", files["alice"], "--from-description",
                         "calm")
    assert "a reference recording (REF.wav) or --from-description" in err
    err = one_line_error(capsys, "voice", "add", "x", files["alice"], "--transcript", " ")
    assert "--transcript must be the words the recording says" in err
    err = one_line_error(capsys, "voice", "add", "x", "--from-description", " ", "--model",
                         files["voicegen"])
    assert "--from-description must describe the voice" in err
    err = one_line_error(capsys, "voice", "add", "x", files["alice"], "--max-new-rows", 5)
    assert "--max-new-rows is for --from-description" in err
    assert not voices.exists() or not list(voices.iterdir())


def test_info_names_the_published_checkpoint(files, capsys):
    assert main(["info", str(files["ttsd"])]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "kind delay, checkpoint MOSS-TTSD-v1.0," in first
