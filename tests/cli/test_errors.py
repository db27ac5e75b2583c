"""The CLI's careless-user cases (issue 11): bad option values, outputs that cannot be written
(a directory, a device, no permission, a full disk, a closed pipe) and undecodable text each give
one line on stderr, before any model work where they can be known then, and leave no file."""

import os
import resource
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from fixtures.make_codec import make_tiny_v1_checkpoint

SR = 3200  # the tiny v1 codec's rate


def cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, **kw)


def one_line_error(r, code=1) -> str:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr


@pytest.fixture(scope="module")
def codec_gguf(tiny_codec):
    return tiny_codec("v1", seed=3)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from fixtures.make_tiny_pair import make_tiny_pair

    return make_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture
def wav(tmp_path):
    t = np.arange(SR) / SR
    path = tmp_path / "in.wav"
    sf.write(path, (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), SR)
    return path


def tts_args(pair, out, *extra):
    nano, codec = pair
    return ("tts-nano", "--model", nano, "--codec", codec, "--text", "Hello there.",
            "--max-frames", 8, "-o", out, *extra)


# --- option values -----------------------------------------------------------------------------

BAD_TTS_VALUES = [("--seed", "-1"), ("--seed", "x"), ("--temperature", "inf"),
                  ("--temperature", "-1"), ("--text-temperature", "nan"), ("--top-p", "1.5"),
                  ("--top-k", "-3"), ("--repetition-penalty", "-1"), ("--max-frames", "0"),
                  ("--voice-clone-max-text-tokens", "0"), ("--threads", "0"),
                  ("--sample-format", "s8")]


def in_process(*args, capsys):
    """main() in this process (argparse stops before any model work, so this is the CLI's whole
    behaviour for a bad value, without a subprocess per case) → (exit code, stderr)."""
    from moss_tts.cli import main

    with pytest.raises(SystemExit) as stop:
        main([str(a) for a in args])
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize("flag,value", BAD_TTS_VALUES)
def test_bad_tts_option_value_is_one_line_naming_the_flag(pair, tmp_path, capsys, flag, value):
    code, err = in_process(*tts_args(pair, tmp_path / "o.wav", flag, value), capsys=capsys)
    assert code == 2 and err.startswith("error: argument " + flag) and err.count("\n") == 1, err
    assert not (tmp_path / "o.wav").exists()


def test_bad_option_value_from_the_real_command_line(pair, tmp_path):
    r = cli(*tts_args(pair, tmp_path / "o.wav", "--seed", "-1"))
    assert "argument --seed: must be at least 0, got -1" in one_line_error(r, code=2)


def test_a_zero_temperature_is_one_line_naming_the_greedy_flag(pair, tmp_path):
    """A temperature of 0 was greedy for Delay's channels and an error for Nano; one rule now
    (issue 31, finding 10): every family's options class refuses it, so the flag is refused
    before the model loads, naming the flag that is greedy."""
    r = cli(*tts_args(pair, tmp_path / "o.wav", "--temperature", "0"))
    assert "argument --temperature: must be finite and > 0, got 0.0 (greedy decoding is the " \
           "--greedy switch, not a temperature of 0)" in one_line_error(r, code=2)
    assert not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("command", ["encode", "decode", "reconstruct"])
@pytest.mark.parametrize("value", ["nan", "0", "-1", "inf"])
def test_bad_chunk_seconds_is_rejected_by_every_codec_command(codec_gguf, wav, tmp_path, capsys,
                                                              command, value):
    out = tmp_path / ("o.npy" if command == "encode" else "o.wav")
    code, err = in_process(command, wav, "--codec", codec_gguf, "-o", out, "--chunk-seconds",
                           value, capsys=capsys)
    assert code == 2 and err.startswith("error: argument --chunk-seconds")
    assert err.count("\n") == 1 and not out.exists()


def test_non_utf8_text_file_is_one_line(pair, tmp_path):
    text = tmp_path / "latin1.txt"
    text.write_bytes("Grüße aus Köln.".encode("latin-1"))
    nano, codec = pair
    r = cli("tts-nano", "--model", nano, "--codec", codec, "--text-file", text, "-o",
            tmp_path / "o.wav")
    err = one_line_error(r)
    assert str(text) in err and "UTF-8" in err and not (tmp_path / "o.wav").exists()


def test_non_utf8_stdin_is_one_line(pair, tmp_path):
    nano, codec = pair
    r = subprocess.run([sys.executable, "-m", "moss_tts", "tts-nano", "--model", str(nano),
                        "--codec", str(codec), "-o", str(tmp_path / "o.wav")],
                       input=b"caf\xe9", capture_output=True)
    r.stderr = r.stderr.decode()
    assert "stdin" in one_line_error(r) and not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("extra,names", [
    (("--prompt-text", "hello"), "--prompt-audio"),
    (("--prompt-audio", "REF"), "--prompt-text"),
    (("--prompt-audio", "REF", "--prompt-text", "yo", "--reference", "REF"), "--reference"),
    (("--format", "raw"), "--format raw")])
def test_flag_combinations_are_refused_before_loading_in_flag_words(tmp_path, wav, extra, names):
    missing = _missing_model(tmp_path)
    extra = [wav if a == "REF" else a for a in extra]
    r = cli("tts-nano", "--model", missing, "--codec", missing, "--text", "hi", "-o",
            tmp_path / "o.wav", *extra)
    err = one_line_error(r)
    assert names in err and str(missing) not in err


def test_threads_beyond_the_usable_cores_are_capped_with_a_warning(codec_gguf, wav, tmp_path):
    r = cli("encode", wav, "--codec", codec_gguf, "-o", tmp_path / "c.npy", "--threads", 1000)
    assert r.returncode == 0, r.stderr
    cores = len(os.sched_getaffinity(0))
    assert f"1000 threads requested, but this process may use {cores} cores" in r.stderr


# --- where the output goes ---------------------------------------------------------------------


def _missing_model(tmp_path):
    return tmp_path / "no-model.gguf"


@pytest.mark.parametrize("case", ["directory", "parent_is_a_file", "device", "unwritable",
                                  "wrong_suffix"])
def test_unusable_destination_fails_before_any_model_work(tmp_path, case):
    """The model paths do not exist: had the command loaded anything first, the error would name
    the model, not the output."""
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    out = {"directory": tmp_path, "parent_is_a_file": blocker / "o.wav", "device": "/dev/full",
           "unwritable": "/proc/moss-tts-test/o.wav", "wrong_suffix": tmp_path / "o.mp3"}[case]
    missing = _missing_model(tmp_path)
    for args in (("tts-nano", "--model", missing, "--codec", missing, "--text", "hi", "-o", out),
                 ("decode", missing, "--codec", missing, "-o", out),
                 ("reconstruct", missing, "--codec", missing, "-o", out)):
        err = one_line_error(cli(*args))
        assert str(out) in err and str(missing) not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


@pytest.mark.parametrize("command", ["encode", "convert"])
def test_encode_and_convert_check_the_destination_first(tmp_path, command):
    missing = _missing_model(tmp_path)
    args = {"encode": ("encode", missing, "--codec", missing, "-o", tmp_path),
            "convert": ("convert", "codec", "--model", missing, "-o", tmp_path)}[command]
    err = one_line_error(cli(*args))
    assert "is a directory" in err and str(missing) not in err


def test_stdout_closed_or_a_terminal_is_refused_before_work(tmp_path):
    missing = _missing_model(tmp_path)
    args = [sys.executable, "-m", "moss_tts", "tts-nano", "--model", str(missing), "--codec",
            str(missing), "--text", "hi", "-o", "-"]
    r = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       preexec_fn=lambda: os.close(1))
    assert "stdout is closed" in one_line_error(r)
    import pty

    main, child = pty.openpty()
    try:
        r = subprocess.run(args, stdout=child, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(main)
        os.close(child)
    assert "stdout is a terminal" in one_line_error(r)


def _file_size_limit(limit):
    """A full disk in miniature: writes past `limit` bytes fail (EFBIG; Python ignores SIGXFSZ)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("case", ["decode", "reconstruct", "reconstruct_flac", "encode", "convert"])
def test_a_write_that_runs_out_of_space_is_one_line_and_leaves_nothing(codec_gguf, wav, tmp_path,
                                                                      case):
    """reconstruct_flac: libsndfile's FLAC encoder drops failed writes, so this one used to
    report success and leave a truncated file."""
    codes = tmp_path / "c.npy"
    np.save(codes, np.arange(8 * 400, dtype=np.int32).reshape(8, 400) % 64)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    ckpt = make_tiny_v1_checkpoint(tmp_path / "ckpt", seed=3)
    out = out_dir / {"encode": "o.npy", "convert": "o.gguf", "reconstruct_flac": "o.flac"}.get(
        case, "o.wav")
    args, limit = {
        "decode": (("decode", codes, "--codec", codec_gguf), 1024),
        "reconstruct": (("reconstruct", wav, "--codec", codec_gguf, "--sample-format", "f32"),
                        1024),
        "reconstruct_flac": (("reconstruct", wav, "--codec", codec_gguf), 1024),
        "encode": (("encode", wav, "--codec", codec_gguf), 64),
        "convert": (("convert", "codec", "--model", ckpt), 4096),
    }[case]
    r = cli(*args, "-o", out, preexec_fn=_file_size_limit(limit))
    assert str(out) in one_line_error(r) and "cannot write" in r.stderr
    assert list(out_dir.iterdir()) == []


def test_streaming_to_a_full_device_is_one_line(pair):
    with open("/dev/full", "wb") as full:
        r = subprocess.run([sys.executable, "-m", "moss_tts",
                            *map(str, tts_args(pair, "-"))], stdout=full, stderr=subprocess.PIPE,
                           text=True)
    assert "stdout: cannot write (No space left on device)" in one_line_error(r)


def test_printing_commands_into_a_full_device_are_one_line(pair):
    for args in (("doctor",), ("info", pair[1]), ("info", pair[1], "--json")):
        with open("/dev/full", "wb") as full:
            r = subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)], stdout=full,
                               stderr=subprocess.PIPE, text=True)
        assert "stdout: cannot write (No space left on device)" in one_line_error(r)


def _closed_pipe_run(args, env=None):
    """Run with stdout a pipe whose reader is already gone (as `| head` after it has read)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        os.close(write_end)


def test_broken_pipe_is_one_line_for_audio_on_stdout(pair, codec_gguf, tmp_path):
    """Audio cut short is an error (cli/common.py's `writing` says why): tts and decode alike."""
    codes = tmp_path / "c.npy"
    np.save(codes, np.arange(8 * 50, dtype=np.int32).reshape(8, 50) % 64)
    for args in (tts_args(pair, "-"), ("decode", codes, "--codec", codec_gguf, "-o", "-")):
        err = one_line_error(_closed_pipe_run(args))
        assert "reader closed the pipe" in err


def test_a_reader_that_stops_early_is_no_error_for_text_commands(pair, tmp_path):
    """issue 22 #10: `info FILE | head` exited 1 with an error; a text reader that closes the
    pipe has read what it wanted, so the command ends quietly with exit 0."""
    from moss_tts.voices import add_voice

    add_voice("bob", np.zeros((3, 2), np.int32), {"variant": "v1", "sample_rate": 24000},
              root=tmp_path)
    for args in (("info", pair[1], "--json"), ("info", pair[1]), ("doctor",),
                 ("voice", "list", "--quiet")):
        r = _closed_pipe_run(args, env={**os.environ, "MOSS_TTS_VOICES": str(tmp_path)})
        assert (r.returncode, r.stderr) == (0, ""), (args, r.returncode, r.stderr)


def test_missing_output_directory_is_one_line_naming_o_and_creates_nothing(tmp_path):
    """issue 22 #10: `-o /nonexistent/dir/x.wav` created the directories silently. The model
    paths do not exist: the output is checked first, in every command that writes one."""
    missing = _missing_model(tmp_path)
    absent = tmp_path / "no" / "such"
    for args in (("tts-nano", "--model", missing, "--codec", missing, "--text", "hi", "-o",
                  absent / "o.wav"),
                 ("decode", missing, "--codec", missing, "-o", absent / "o.flac"),
                 ("reconstruct", missing, "--codec", missing, "-o", absent / "o.wav"),
                 ("encode", missing, "--codec", missing, "-o", absent / "c.npy"),
                 ("convert", "codec", "--model", missing, "-o", absent / "m.gguf")):
        err = one_line_error(cli(*args))
        assert f"-o {absent}" in err and "does not exist" in err, err
    assert not (tmp_path / "no").exists()


def test_decode_into_a_missing_directory_writes_nothing(codec_gguf, tmp_path):
    codes = tmp_path / "c.npy"
    np.save(codes, np.arange(8 * 50, dtype=np.int32).reshape(8, 50) % 64)
    err = one_line_error(cli("decode", codes, "--codec", codec_gguf, "-o",
                             tmp_path / "new" / "o.wav"))
    assert "does not exist" in err and not (tmp_path / "new").exists()


def test_output_through_a_symlink_writes_the_target_and_keeps_the_link(codec_gguf, tmp_path):
    """issue 22 #10: `-o link.wav` replaced the symlink by a plain file."""
    codes = tmp_path / "c.npy"
    np.save(codes, np.arange(8 * 50, dtype=np.int32).reshape(8, 50) % 64)
    (tmp_path / "store").mkdir()
    target = tmp_path / "store" / "real.wav"
    link = tmp_path / "link.wav"
    link.symlink_to(target)
    r = cli("decode", codes, "--codec", codec_gguf, "-o", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert sf.info(target).frames == 50 * 64
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["real.wav"]
    dangling = tmp_path / "dangling.wav"   # a link into a missing directory: refused like one
    dangling.symlink_to(tmp_path / "gone" / "x.wav")
    assert "does not exist" in one_line_error(cli("decode", codes, "--codec", codec_gguf,
                                                  "-o", dangling))


def _address_space(limit):
    """Bounds the child's memory, so that a chunk the bound failed to stop fails fast instead
    of taking the machine (the unbounded 3600 s chunk asked numpy for 13.4 GiB)."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_chunk_seconds_past_the_bound_is_one_line_before_any_work(codec_gguf, tmp_path):
    """issue 22 #10: `decode --chunk-seconds 3600` on 400 s of codes was a 13.4 GiB traceback.
    Past the bound of every codec argparse refuses it; past this codec's own bound (30 s for
    the tiny codec's 200 positions/s) it is one line after the cheap load, before any work."""
    codes = tmp_path / "c.npy"
    np.save(codes, np.arange(8 * 20000, dtype=np.int32).reshape(8, 20000) % 64)   # 400 s
    out = tmp_path / "o.wav"
    r = cli("decode", codes, "--codec", codec_gguf, "-o", out, "--chunk-seconds", 3600,
            preexec_fn=_address_space(4 << 30))
    assert "--chunk-seconds: '3600' must be at most 60" in one_line_error(r, code=2)
    r = cli("decode", codes, "--codec", codec_gguf, "-o", out, "--chunk-seconds", 45,
            preexec_fn=_address_space(4 << 30))
    err = one_line_error(r)
    assert "--chunk-seconds 45: this codec takes at most 30 s" in err and not out.exists()
    helptext = cli("decode", "--help").stdout
    assert "its masks with its square" in " ".join(helptext.split())


def test_a_chunk_this_machine_cannot_hold_is_one_line(codec_gguf, tmp_path, capsys, monkeypatch):
    """Within the bound a small machine may still run out: numpy's MemoryError becomes one line
    naming --chunk-seconds (the allocation is simulated: the real one would take the machine)."""
    from moss_tts.cli import main
    from moss_tts.codec import Codec

    def out_of_memory(self, *args, **kw):
        raise MemoryError("Unable to allocate 13.4 GiB")

    monkeypatch.setattr(Codec, "decode", out_of_memory)
    codes = tmp_path / "c.npy"
    np.save(codes, np.arange(8 * 50, dtype=np.int32).reshape(8, 50) % 64)
    out = tmp_path / "o.wav"
    assert main(["decode", str(codes), "--codec", str(codec_gguf), "-o", str(out),
                 "--chunk-seconds", "20"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --chunk-seconds 20: not enough free memory") and \
        err.count("\n") == 1 and not out.exists()


def test_text_from_argv_that_is_not_utf8_is_one_line_naming_text(pair, tmp_path):
    """issue 22 #3: `--text $'\\xff\\xfe'` said "text is empty" (Nano dropped the bytes)."""
    nano, codec = pair
    out = tmp_path / "o.wav"
    r = subprocess.run([sys.executable.encode(), b"-m", b"moss_tts", b"tts-nano", b"--model",
                        str(nano).encode(), b"--codec", str(codec).encode(), b"--text",
                        b"\xff\xfe", b"-o", str(out).encode()], capture_output=True, text=True)
    assert one_line_error(r).startswith("error: --text: not UTF-8 text (byte 0: b'\\xff')")
    assert not out.exists()
