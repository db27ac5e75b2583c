"""`python -m moss_tts serve`: the speech server (moss_tts/server/) over the models its flags
load."""

from __future__ import annotations

import itertools
import logging
import os
import sys
from pathlib import Path

from ..errors import InputError
from .common import (add_runtime_flags, count, port, positive_float, positive_int, resolve,
                     resolve_model, say, streams_argument)


def _serve(args) -> int:
    import uvicorn

    from ..server.app import create_app
    from ..server.connections import Limits, uvicorn_config

    api_key = args.api_key or os.environ.get("MOSS_TTS_API_KEY") or None
    if args.access_log:
        logging.getLogger("moss_tts.access").setLevel(logging.INFO)
    if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {args.host} without --api-key: anyone who can reach it "
              "can use it", file=sys.stderr)
    room_for_connections(args.max_connections)
    models = load_models(args)
    app = create_app(models, queue_depth=args.queue, api_key=api_key,
                     cors_origins=args.cors_origin, allowed_hosts=args.allowed_host,
                     bind_host=args.host, access_log=args.access_log,
                     write_timeout=args.write_timeout, max_voices=args.max_voices,
                     live_idle=args.live_idle, live_context=args.live_context,
                     max_streams=args.max_streams, body_timeout=args.body_timeout)
    limits = Limits(args.max_connections, args.header_timeout, args.write_timeout)
    say(args, f"serving {', '.join(models)} on http://{args.host}:{args.port} (POST "
               f"/v1/audio/speech{', API key required' if api_key else ''})")
    uvicorn.Server(uvicorn_config(app, limits, host=args.host, port=args.port)).run()
    return 0


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


def add_parser(sub, common) -> None:
    from ..models.registry import DEFAULT
    from ..server.voice_index import MAX_VOICES
    from ..server.connections import HEADER_TIMEOUT, MAX_CONNECTIONS, WRITE_TIMEOUT
    from ..server.live import LIVE_IDLE
    from ..server.request import BODY_TIMEOUT, MIN_BODY_RATE

    p = sub.add_parser("serve", help="OpenAI-style speech API (POST /v1/audio/speech)",
                       parents=[common])
    p.add_argument("--model", action="append", default=None,
                   help="a model GGUF of any family, published MOSS-TTS-GGUF directory or Nano "
                        f"repo id; repeatable: a request's 'model' picks one, the first serves "
                        f"OpenAI's names (default {DEFAULT.default_model})")
    p.add_argument("--codec", action="append", default=None,
                   help="each --model's codec GGUF or repo id, in the same order (default: "
                        "the family's, as `tts --help` lists)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=port, default=8080)
    p.add_argument("--queue", type=count, default=4,
                   help="requests that may wait behind the running one (or --max-streams); more "
                        "get 503; 0: none wait")
    p.add_argument("--max-streams", type=streams_argument, default=None, metavar="N|auto",
                   help="speech requests to one model decoded together in one batched decode, "
                   "each joining at the next step and leaving when done (streamed ones get "
                   "audio as made); --queue more wait behind them. Default auto: 4 for a family "
                   "with a batched decoder (under load 4 make 1.8-3.8x one stream's audio per second "
                   "on two cores, by weight type; a lone request runs up to 5%% slower than "
                   "with 1: docs/performance.md, Several streams), 1 for another; 1 = one "
                   "request at a time")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on all but /health and the page "
                        "(default: $MOSS_TTS_API_KEY, else no key)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let pages from ORIGIN (e.g. http://app.example:3000) call the API; "
                        "repeatable. Other origins are refused (403)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer to Host NAME (besides 127.0.0.1, localhost, [::1] and "
                        "--host); repeatable, '*' allows any")
    p.add_argument("--access-log", action="store_true", help="log one line per request")
    p.add_argument("--write-timeout", type=positive_float, default=WRITE_TIMEOUT,
                   metavar="SECONDS", help="cut a client whose socket takes no bytes for this "
                   "long, for every response: whole, streamed and live (default %(default)g)")
    p.add_argument("--max-connections", type=positive_int, default=MAX_CONNECTIONS,
                   metavar="N", help="open connections (HTTP and live) at most; more get a "
                   "503 at once (default %(default)s)")
    p.add_argument("--header-timeout", type=positive_float, default=HEADER_TIMEOUT,
                   metavar="SECONDS", help="close a connection that sends no complete request "
                   "headers for this long after it opens or after its last response "
                   "(default %(default)g)")
    p.add_argument("--body-timeout", type=positive_float, default=BODY_TIMEOUT,
                   metavar="SECONDS", help="answer 408 and close a connection whose request "
                   f"body has not arrived this long after its headers, plus 1 s per "
                   f"{MIN_BODY_RATE} bytes it sent (default %(default)g)")
    p.add_argument("--live-idle", type=positive_float, default=LIVE_IDLE, metavar="SECONDS",
                   help="close a live connection that sends nothing for this long while "
                   "nothing is spoken, freeing its place in the line (default %(default)g)")
    p.add_argument("--live-context", type=positive_int, default=None, metavar="ROWS",
                   help="backbone rows of a live conversation (its turns' text and audio); "
                   "short of room, a new turn drops the oldest turns, the system and voice "
                   "blocks kept (default: the model's own size, which the live 'started' "
                   "event states)")
    p.add_argument("--max-voices", type=positive_int, default=MAX_VOICES, metavar="N",
                   help="voices the voices directory may hold before POST /v1/audio/voices "
                        "answers 409 (default %(default)s)")
    add_runtime_flags(p)
    p.set_defaults(func=_serve)


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

    specs, codecs = args.model or [DEFAULT.default_model], args.codec or []
    if len(codecs) > len(specs):
        raise InputError(f"{len(codecs)} --codec for {len(specs)} --model: give each model's "
                         "codec after it, in the same order")
    models: dict = {}
    try:
        for spec, codec in itertools.zip_longest(specs, codecs):
            path, family = resolve_model(spec)
            name = f"moss-tts-{family.kind}" if f"moss-tts-{family.kind}" not in models \
                else Path(spec).stem
            if name in models:
                raise InputError(f"--model {spec}: the name {name!r} is taken; rename the file")
            codec = resolve(codec or family.default_codec, "codec", "--codec")
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
