"""`python -m moss_tts serve`: the speech server (moss_tts/server/) over the models its flags
load."""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
from pathlib import Path

from ..errors import InputError
from .common import add_runtime_flags, auto_or, number, resolve_codec, resolve_model, say


def _serve(args) -> int:
    import uvicorn

    from ..server.access import LOOPBACK
    from ..server.app import create_app
    from ..server.connections import uvicorn_config

    settings = settings_of(args)
    if settings.access_log:
        logging.getLogger("moss_tts.access").setLevel(logging.INFO)
    if settings.api_key is None and settings.host not in LOOPBACK:
        print(f"warning: serving on {settings.host} without --api-key: anyone who can reach it "
              "can use it", file=sys.stderr)
    room_for_connections(settings.max_connections)
    models = load_models(args)
    app = create_app(models, settings)
    say(args, f"serving {', '.join(models)} on http://{settings.host}:{settings.port} (POST "
               f"/v1/audio/speech{', API key required' if settings.api_key else ''})")
    uvicorn.Server(uvicorn_config(app, settings, host=settings.host, port=settings.port)).run()
    return 0


def settings_of(args):
    """The server's settings from serve's flags (the API key from $MOSS_TTS_API_KEY without
    --api-key)."""
    from ..server.settings import ServerSettings, flag_fields

    given = {f.name: getattr(args, f.name) for f in flag_fields()}
    return ServerSettings(**given | {"api_key": given["api_key"]
                                     or os.environ.get("MOSS_TTS_API_KEY") or None})


# descriptors the process needs beside its connections: model files, logs, the listener
SPARE_FILES = 64


def room_for_connections(n: int) -> None:
    """Raise the open-file limit to fit --max-connections (up to the hard limit), or refuse it:
    past the file limit the server could accept nothing, not even /health."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + SPARE_FILES
    if need <= soft:
        return
    try:
        if hard != resource.RLIM_INFINITY and need > hard:
            raise ValueError("past the hard limit")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    except (ValueError, OSError):
        most = soft if hard == resource.RLIM_INFINITY else hard
        raise InputError(f"--max-connections {n} needs {need} open files; this process may "
                         f"open {most} (ulimit -n): give at most {most - SPARE_FILES}") from None


def commands() -> dict[str, str]:
    return {"serve": "OpenAI-style speech API (POST /v1/audio/speech)"}


def add_flags(p, command: str, common) -> None:
    from ..models.registry import DEFAULT

    p.add_argument("--model", action="append", default=None,
                   help="a model GGUF of any family, published MOSS-TTS-GGUF directory or Nano "
                        f"repo id; repeatable: a request's 'model' picks one, the first serves "
                        f"OpenAI's names (default {DEFAULT.default_model})")
    p.add_argument("--codec", action="append", default=None,
                   help="each --model's codec GGUF or repo id, in the same order (default: "
                        "the family's, as `tts --help` lists)")
    add_settings_flags(p)
    add_runtime_flags(p)
    p.set_defaults(func=_serve)


def add_settings_flags(p: argparse.ArgumentParser) -> None:
    """One flag per server setting that has help (server/settings.py), with the field's
    default, bounds and help (and the default shown where it is a value): a list setting's
    flag is repeated, a bool's takes no value."""
    from ..server.settings import flag_fields, flag_of, kind_of

    for f in flag_fields():
        kind, meta = kind_of(f.name), f.metadata
        shown = "" if f.default is None or kind in (bool, tuple) else \
            f" (default {format(f.default, 'g' if kind is float else '')})"
        words = dict(dest=f.name, help=(meta["help"] + shown).replace("%", "%%"))
        if kind is bool:
            p.add_argument(flag_of(f), action="store_true", **words)
        elif kind is tuple:
            p.add_argument(flag_of(f), action="append", default=[], metavar=meta["metavar"],
                           **words)
        else:
            p.add_argument(flag_of(f), type=setting_type(f, kind), default=f.default,
                           metavar=meta["metavar"], **words)


def setting_type(f, kind):
    """argparse `type=` for a server setting of `kind`: a number within the field's bounds
    ("auto", where it takes it, is None), or the text; the message without the flag (argparse
    names it)."""
    from ..server.settings import within

    def typed(text: str):
        if kind not in (int, float):
            return text
        try:
            return within(f, number(text, kind), repr(text))
        except InputError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    typed.__name__ = f.name     # argparse says "invalid <name> value" for other errors
    return auto_or(typed) if f.metadata["auto"] else typed


def hosted_apart(backend: str | None) -> bool:
    """Whether models on `backend` run in child processes (server/hosted.py): a backend that
    can be lost mid-call (a remote one, a device) ends the process that calls it, so the
    server keeps it apart; the CPU cannot be lost, and runs in this process."""
    return backend is not None and backend.strip().lower() != "cpu"


def load_models(args) -> dict:
    """serve's --model (repeatable; the default family's model without one) and --codec paired
    with them in order (each model's family default where missing) → {name: loaded TTS}, named
    moss-tts-<family> (the file's stem when two share a family). A failure closes what was
    loaded."""
    from ..models.registry import DEFAULT
    from ..server.hosted import HostedModel, HostSpec
    from ..server.served import served_name

    specs, codecs = args.model or [DEFAULT.default_model], args.codec or []
    if len(codecs) > len(specs):
        raise InputError(f"{len(codecs)} --codec for {len(specs)} --model: give each model's "
                         "codec after it, in the same order")
    models: dict = {}
    try:
        for spec, codec in itertools.zip_longest(specs, codecs):
            path, family = resolve_model(spec)
            name = served_name(family.kind) if served_name(family.kind) not in models \
                else Path(spec).stem
            if name in models:
                raise InputError(f"--model {spec}: the name {name!r} is taken; rename the file")
            codec = resolve_codec(codec, family, model=spec)
            if hosted_apart(args.backend):
                models[name] = HostedModel(HostSpec(str(path), codec and str(codec),
                                                    args.backend, args.threads), name)
            else:
                models[name] = family.tts_class().load(path, codec=codec, backend=args.backend,
                                                       threads=args.threads)
    except BaseException:
        for tts in models.values():
            tts.close()
        raise
    return models
