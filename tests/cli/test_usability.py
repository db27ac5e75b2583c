"""The newcomer path and consistency (issue 11): the offline error names the flag to use, the
tiny model pair makes a first run without the hub, --codec takes what --model takes in every
command, --debug works on either side of the subcommand, voice list says where voices live,
info --json is complete, and a file and stdout carry the same samples under one documented
sample format (stdout with a proper streaming WAV header)."""

import json
import os
import shlex
import struct
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_codec import make_tiny_v1_checkpoint


def cli(*args, env=None, stdout=subprocess.PIPE, **kw):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)], stdout=stdout,
                          stderr=subprocess.PIPE, env={**os.environ, **(env or {})}, **kw)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from fixtures.make_tiny_pair import make_tiny_pair

    return make_tiny_pair(tmp_path_factory.mktemp("pair"))


def offline_env(tmp_path):
    """No network and an empty Hugging Face cache: what a first run on an offline machine sees."""
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
            "MOSS_TTS_CACHE": str(tmp_path / "cache")}


def test_offline_default_model_names_the_flag_and_the_offline_way(tmp_path):
    r = cli("tts-nano", "--text", "Hello.", "-o", tmp_path / "o.wav", env=offline_env(tmp_path),
            text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: --model OpenMOSS-Team/MOSS-TTS-Nano: ")
    assert "fixtures.make_tiny_pair" in r.stderr and not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("command", ["encode", "decode", "reconstruct"])
def test_codec_commands_resolve_codec_like_tts_nano(tmp_path, command):
    """--codec takes a checkpoint directory (converted into the cache) or a repo id (offline
    here: the error names --codec and the hub, not "no such file")."""
    t = np.arange(3200) / 3200
    wav = tmp_path / "in.wav"
    sf.write(wav, (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 3200)
    codes = tmp_path / "c.npy"
    np.save(codes, np.arange(8 * 10, dtype=np.int32).reshape(8, 10) % 64)
    source, out = {"encode": (wav, "o.npy"), "decode": (codes, "o.wav"),
                   "reconstruct": (wav, "o.wav")}[command]
    ckpt = make_tiny_v1_checkpoint(tmp_path / "ckpt", seed=3)
    env = offline_env(tmp_path)
    r = cli(command, source, "--codec", ckpt, "-o", tmp_path / out, env=env, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / out).is_file() and list((tmp_path / "cache" / "gguf").glob("*.gguf"))
    r = cli(command, source, "--codec", "Some-Org/some-codec", "-o", tmp_path / ("x" + out[1:]),
            env=env, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: --codec Some-Org/some-codec: ") and "hub" in r.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_works_before_or_after_the_subcommand(tmp_path, where):
    missing = tmp_path / "none.gguf"
    args = ("--debug", "info", missing) if where == "before" else ("info", missing, "--debug")
    r = cli(*args, text=True)
    assert r.returncode != 0 and "Traceback" in r.stderr and "ModelFileError" in r.stderr, r.stderr
    quiet = cli("info", missing, text=True)
    assert quiet.stderr.startswith("error: ") and quiet.stderr.count("\n") == 1


def test_voice_list_says_where_voices_are_stored(tmp_path):
    voices = tmp_path / "my-voices"
    r = cli("voice", "list", env={"MOSS_TTS_VOICES": str(voices)}, text=True)
    assert r.returncode == 0 and f"0 voice(s) in {voices}" in r.stderr and r.stdout == ""
    helptext = cli("voice", "--help", env={"MOSS_TTS_VOICES": str(voices)}, text=True).stdout
    assert str(voices) in "".join(helptext.split())  # argparse wraps the long path


def test_info_json_prints_every_array_element(tmp_path):
    from converters.gguf_io import write_gguf

    ids = np.arange(1000, dtype=np.int32) * 7
    path = write_gguf(tmp_path / "a.gguf", {"w.weight": np.ones((2, 3), np.float32)},
                      {"moss.test.ids": ids, "moss.test.name": "x" * 500}, kind="test", version=1)
    meta = json.loads(cli("info", path, "--json").stdout)["metadata"]
    assert meta["moss.test.ids"] == ids.tolist() and meta["moss.test.name"] == "x" * 500
    text = cli("info", path, text=True).stdout  # the human view stays short
    assert "... (1000 items)" in text


def test_tiny_pair_command_gives_a_working_first_run(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    made = subprocess.run([sys.executable, "-m", "fixtures.make_tiny_pair", str(tmp_path / "m")],
                          capture_output=True, text=True, cwd=root)
    assert made.returncode == 0, made.stderr
    command = shlex.split(made.stdout.strip())
    assert command[:4] == ["python", "-m", "moss_tts", "tts-nano"] and command[-1] == "out.wav"
    seeded = [sys.executable, *command[1:-1], str(tmp_path / "out.wav"), "--seed", "1"]
    r = subprocess.run(seeded, capture_output=True, text=True,
                       env={**os.environ, **offline_env(tmp_path)})
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(tmp_path / "out.wav")
    assert sr == 1600 and audio.shape[1] == 2 and len(audio) > 0.5 * sr and np.abs(audio).max() > 0


# --- output formats ----------------------------------------------------------------------------


def speak(pair, out, *extra, **kw):
    nano, codec = pair
    return cli("tts-nano", "--model", nano, "--codec", codec, "--text", "Hello there.", "--seed",
               5, "--max-frames", 12, "-o", out, *extra, **kw)


def wav_sizes(data: bytes) -> tuple[int, int]:
    """(RIFF size, data size) of a 44-byte-header WAV."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE" and data[36:40] == b"data"
    return struct.unpack("<I", data[4:8])[0], struct.unpack("<I", data[40:44])[0]


@pytest.mark.parametrize("sample_format,subtype", [(None, "PCM_16"), ("s16", "PCM_16"),
                                                   ("s24", "PCM_24"), ("f32", "FLOAT")])
def test_file_and_stdout_carry_the_same_samples(pair, tmp_path, sample_format, subtype):
    extra = () if sample_format is None else ("--sample-format", sample_format)
    assert speak(pair, tmp_path / "f.wav", *extra).returncode == 0
    assert sf.info(tmp_path / "f.wav").subtype == subtype
    with open(tmp_path / "redirected.wav", "wb") as f:   # `-o - > file`: seekable stdout
        assert speak(pair, "-", *extra, stdout=f).returncode == 0
    piped = speak(pair, "-", *extra).stdout               # a pipe: the streaming header
    redirected = (tmp_path / "redirected.wav").read_bytes()
    n_data = len(redirected) - 44
    assert wav_sizes(redirected) == (n_data + 36, n_data)
    assert wav_sizes(piped) == (0xFFFFFFFF, 0xFFFFFFFF) and piped[44:] == redirected[44:]
    read = "float32" if sample_format == "f32" else "int32"
    file_samples, _ = sf.read(tmp_path / "f.wav", dtype=read)
    stream_samples, _ = sf.read(tmp_path / "redirected.wav", dtype=read)
    assert len(file_samples) > 0 and np.array_equal(file_samples, stream_samples)
    raw = speak(pair, "-", *extra, "--format", "raw").stdout
    assert raw == redirected[44:]


def test_flac_defaults_to_16_bit_and_refuses_float_before_work(pair, tmp_path):
    assert speak(pair, tmp_path / "a.flac").returncode == 0
    assert sf.info(tmp_path / "a.flac").subtype == "PCM_16"
    r = cli("tts-nano", "--model", tmp_path / "none.gguf", "--text", "hi", "-o",
            tmp_path / "b.flac", "--sample-format", "f32", text=True)
    assert r.returncode == 1 and "FLAC stores integer samples" in r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "b.flac").exists()


def test_voice_list_shows_each_voices_codec(pair, tmp_path):
    """issue 22 #10: a model takes voices of its own codec only, so the list says which codec
    made each (and says so when a voice stored before codecs were recorded cannot tell)."""
    from moss_tts.codec import Codec

    voices = tmp_path / "voices"
    t = np.arange(1600) / 1600
    ref = tmp_path / "ref.wav"
    sf.write(ref, (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 1600)
    env = {"MOSS_TTS_VOICES": str(voices)}
    r = cli("voice", "add", "bob", ref, "--codec", pair[1], "--quiet", env=env, text=True)
    assert r.returncode == 0, r.stderr
    np.save(voices / "old.npy", np.zeros((3, 2), np.int32))   # the layout before codec info
    with Codec.load(pair[1]) as codec:
        variant, rate = codec.config.variant, codec.sample_rate
    lines = cli("voice", "list", env=env, text=True).stdout.splitlines()
    assert [(line.split("\t")[0], line.split("\t")[2]) for line in lines] == [
        ("bob", f"{variant} codec, {rate} Hz"), ("old", "codec unknown")]


def test_text_file_dash_reads_stdin(pair, tmp_path):
    """issue 22 #10: `--text-file -` did not mean stdin."""
    from_flag = speak(pair, tmp_path / "a.wav")
    nano, codec = pair
    r = cli("tts-nano", "--model", nano, "--codec", codec, "--text-file", "-", "--seed", 5,
            "--max-frames", 12, "-o", tmp_path / "b.wav", input=b"Hello there.")
    assert from_flag.returncode == 0 and r.returncode == 0, r.stderr
    a, _ = sf.read(tmp_path / "a.wav")
    b, _ = sf.read(tmp_path / "b.wav")
    assert len(a) > 0 and np.array_equal(a, b)
