"""The command line end to end on the tiny codec: convert, encode, decode, reconstruct; bad
input prints one line, exits non-zero and leaves no output file."""

import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_codec import make_tiny_v1_checkpoint

SR = 3200  # the tiny codec's rate


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def codec_gguf(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    ckpt = make_tiny_v1_checkpoint(d / "ckpt", seed=3)
    out = cli("convert", "codec", "--model", ckpt, "--out", d / "codec.gguf", "--strict")
    assert out.returncode == 0, out.stderr
    return d / "codec.gguf"


@pytest.fixture
def wav(tmp_path, rng):
    t = np.arange(2 * SR) / SR
    x = 0.3 * np.sin(2 * np.pi * 200 * t) + 0.05 * rng.standard_normal(t.size)
    path = tmp_path / "in.wav"
    sf.write(path, x.astype(np.float32), SR)
    return path


def test_encode_decode_reconstruct_round_trip(codec_gguf, wav, tmp_path):
    codes = tmp_path / "codes.npy"
    r = cli("encode", wav, "--codec", codec_gguf, "--out", codes, "--n-quantizers", 6)
    assert r.returncode == 0, r.stderr
    c = np.load(codes)
    assert c.dtype == np.int32 and c.shape == (6, 2 * SR // 64)
    out = tmp_path / "out.wav"
    r = cli("decode", codes, "--codec", codec_gguf, "--out", out, "--n-quantizers", 4)
    assert r.returncode == 0, r.stderr
    y, sr = sf.read(out, dtype="float32")
    assert sr == SR and y.shape == (c.shape[1] * 64,) and np.isfinite(y).all() and np.abs(y).max() > 0
    flac = tmp_path / "rec.flac"
    r = cli("reconstruct", wav, "--codec", codec_gguf, "-o", flac, "--quiet")
    assert r.returncode == 0 and r.stderr == ""
    assert sf.info(flac).samplerate == SR and sf.info(flac).frames == c.shape[1] * 64


@pytest.mark.parametrize("case", ["codes_not_npy", "codec_not_gguf", "missing_input",
                                  "bad_output_suffix", "too_many_codebooks"])
def test_bad_input_prints_one_line_and_writes_nothing(codec_gguf, wav, tmp_path, case):
    codes = tmp_path / "c.npy"
    np.save(codes, np.zeros((8, 5), np.int32))
    out = tmp_path / "out.wav"
    args = {"codes_not_npy": ("decode", wav, "--codec", codec_gguf, "--out", out),
            "codec_not_gguf": ("encode", wav, "--codec", wav, "--out", tmp_path / "x.npy"),
            "missing_input": ("encode", tmp_path / "none.wav", "--codec", codec_gguf, "--out",
                              tmp_path / "x.npy"),
            "bad_output_suffix": ("decode", codes, "--codec", codec_gguf, "--out", tmp_path / "o.mp3"),
            "too_many_codebooks": ("decode", codes, "--codec", codec_gguf, "--out", out,
                                   "--n-quantizers", 9)}[case]
    r = cli(*args)
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy", "in.wav"]


def test_convert_rejects_unknown_checkpoint_directory(tmp_path):
    r = cli("convert", "codec", "--model", tmp_path, "--out", tmp_path / "x.gguf")
    assert r.returncode == 1 and "config.json" in r.stderr and not (tmp_path / "x.gguf").exists()


def test_dash_out_writes_to_stdout_what_a_file_would_hold(codec_gguf, wav, tmp_path):
    """issue 22 #10: `decode --out -` (and encode, reconstruct) did not mean stdout."""
    codes = tmp_path / "codes.npy"
    for command, source, name in (("encode", wav, "c.npy"), ("decode", codes, "d.wav"),
                                  ("reconstruct", wav, "r.wav")):
        r = cli(command, source, "--codec", codec_gguf, "-o", tmp_path / name, "--quiet")
        assert r.returncode == 0, r.stderr
        if command == "encode":
            np.save(codes, np.load(tmp_path / name))
        piped = subprocess.run([sys.executable, "-m", "moss_tts", command, str(source),
                                "--codec", str(codec_gguf), "-o", "-", "--quiet"],
                               capture_output=True)
        assert piped.returncode == 0, piped.stderr
        assert len(piped.stdout) > 100 and piped.stdout == (tmp_path / name).read_bytes(), command


def test_convert_refuses_dash_out_in_one_line(tmp_path):
    """A GGUF is a file the loader maps: `convert -o -` used to write a file named "-"."""
    ckpt = make_tiny_v1_checkpoint(tmp_path / "ckpt", seed=3)
    r = cli("convert", "codec", "--model", ckpt, "-o", "-", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "-o -: this command writes a file, not stdout" in r.stderr
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_load_no_model_family(flag):
    """Only the command run gets its flags built (issue 33): `--version` and `--help` import
    no module under moss_tts.models but the registry's rows (building every command's flags
    imported all eight families, 26 modules), and `--help` still lists every command with its
    one-line help."""
    from moss_tts.cli import COMMAND_GROUPS

    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "moss_tts", flag],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
              if line.startswith("import time:")}
    assert "moss_tts.cli.tts" in loaded      # guard: the imports were read
    assert {m for m in loaded if m.startswith("moss_tts.models.")} <= {"moss_tts.models.registry"}
    if flag == "--help":
        listed = "".join(out.stdout.split())     # argparse wraps a help line, even at a '-'
        for group in COMMAND_GROUPS:
            for command, helptext in group.commands().items():
                assert command + "".join(helptext.split()) in listed, command
