"""The server's settings (moss_tts/server/settings.py, issue 33): each declared once, with
its default and bounds; `serve`'s flags are generated from them and an embedder's settings
keep the same bounds."""

import dataclasses

import pytest

from moss_tts.errors import InputError
from moss_tts.server.settings import ServerSettings, flag_fields, flag_of


def serve_parser():
    from moss_tts.cli import build_parser

    sub = next(a for a in build_parser(["serve"])._subparsers._group_actions)
    return sub.choices["serve"]


def test_each_setting_with_help_is_a_serve_flag_with_the_fields_default():
    actions = {a.dest: a for a in serve_parser()._actions}
    fields = flag_fields()
    assert len(fields) > 10 and "voices_root" not in {f.name for f in fields}
    for f in fields:
        assert flag_of(f) in actions[f.name].option_strings, f.name
        default = actions[f.name].default
        assert (tuple(default) if isinstance(default, list) else default) == f.default, f.name


def test_the_flags_make_the_settings_they_name():
    from moss_tts.cli.serve import settings_of

    args = serve_parser().parse_args(["--queue", "0", "--max-streams", "auto", "--cors-origin",
                                      "http://a.example", "--access-log", "--write-timeout", "2"])
    got = settings_of(args)
    assert got == dataclasses.replace(ServerSettings(), queue_depth=0, max_streams=None,
                                      cors_origins=("http://a.example",), access_log=True,
                                      write_timeout=2.0, api_key=got.api_key)


@pytest.mark.parametrize("given, message", [
    ({"write_timeout": 0}, "write_timeout 0 must be above 0"),
    ({"queue_depth": -1}, "queue_depth -1 must be at least 0"),
    ({"max_streams": 0}, "max_streams 0 must be at least 1"),
    ({"port": 70000}, "port 70000 must be at most 65535"),
    ({"max_voices": 2.5}, "max_voices 2.5 must be a whole number"),
    ({"write_timeout": None}, "write_timeout None must be a number")])
def test_an_embedders_settings_keep_the_flags_bounds(given, message):
    with pytest.raises(InputError, match=f"^{message}$"):
        ServerSettings(**given)


@pytest.mark.parametrize("flag, text, message", [
    ("--write-timeout", "0", "'0' must be above 0"),
    ("--max-streams", "0", "'0' must be at least 1"),
    ("--queue", "x", "'x' is not a whole number"), ("--port", "70000", "'70000' must be at most")])
def test_a_flag_out_of_its_settings_bounds_is_one_line_naming_it(flag, text, message, capsys):
    with pytest.raises(SystemExit):
        serve_parser().parse_args([flag, text])
    err = capsys.readouterr().err
    assert f"argument {flag}: {message}" in err and len(err.strip().splitlines()) == 1


def test_lists_given_as_lists_are_kept_as_tuples():
    s = ServerSettings(allowed_hosts=["tts.lan"])
    assert s.allowed_hosts == ("tts.lan",) and hash(s)
