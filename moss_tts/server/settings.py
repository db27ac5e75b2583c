"""The speech server's settings, each declared once: its default, its bounds and, for a `serve`
flag, its help. `create_app(models, settings)` takes them, the server's parts read them there,
and `serve`'s flags are generated from them (cli/serve.py), so the command and an embedder
cannot disagree (as llama-cpp-python's server/settings.py declares its server's)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import cache
from types import UnionType
from typing import Union, get_args, get_origin, get_type_hints

from ..errors import InputError
from ..models.batching import MAX_STREAMS
from .access import LOOPBACK, host_name
from .request import MIN_BODY_RATE


def setting(default, help: str | None = None, *, flag: str | None = None,
            metavar: str | None = None, low: float | None = None, above: float | None = None,
            high: float | None = None, auto: bool = False):
    """A settings field: its default, and its `serve` flag's help (a field without help has
    no flag), the flag where it is not `--name` with dashes, its metavar; the bounds every
    value must keep (`low` and `high` inclusive, `above` exclusive); `auto`: the flag also
    takes "auto", the field's None."""
    return field(default=default, metadata={
        "help": help, "flag": flag, "metavar": metavar, "low": low, "above": above,
        "high": high, "auto": auto})


@dataclass(frozen=True)
class ServerSettings:
    host: str = setting(LOOPBACK[0], "address to bind")
    port: int = setting(8080, "TCP port to listen on", low=0, high=65535)
    queue_depth: int = setting(
        4, "requests that may wait behind the running one (or --max-streams); more get 503; "
        "0: none wait", flag="--queue", metavar="N", low=0)
    max_streams: int | None = setting(
        None, "speech requests to one model decoded together in one batched decode, each "
        "joining at the next step and leaving when done (streamed ones get audio as made); "
        f"--queue more wait behind them. Default auto: {MAX_STREAMS} for a family with a "
        "batched decoder (under load 4 make 1.8-3.8x one stream's audio per second on two "
        "cores, by weight type; a lone request runs up to 5% slower than with 1: "
        "docs/performance.md, Several streams), 1 for another; 1 = one request at a time",
        metavar="N|auto", low=1, auto=True)
    api_key: str | None = setting(
        None, "require 'Authorization: Bearer KEY' on all but /health and the page "
        "(default: $MOSS_TTS_API_KEY, else no key)")
    cors_origins: tuple[str, ...] = setting(
        (), "let pages from ORIGIN (e.g. http://app.example:3000) call the API; repeatable. "
        "Other origins are refused (403)", flag="--cors-origin", metavar="ORIGIN")
    allowed_hosts: tuple[str, ...] = setting(
        (), f"also answer to Host NAME (besides {', '.join(map(host_name, LOOPBACK))} and "
        "--host); repeatable, '*' allows any", flag="--allowed-host", metavar="NAME")
    access_log: bool = setting(False, "log one line per request")
    write_timeout: float = setting(
        15.0, "cut a client whose socket takes no bytes for this long, for every response: "
        "whole, streamed and live", metavar="SECONDS", above=0)
    max_connections: int = setting(
        256, "open connections (HTTP and live) at most; more get a 503 at once", metavar="N",
        low=1)
    header_timeout: float = setting(
        10.0, "close a connection that sends no complete request headers for this long after "
        "it opens or after its last response", metavar="SECONDS", above=0)
    body_timeout: float = setting(
        20.0, "answer 408 and close a connection whose request body has not arrived this long "
        f"after its headers, plus 1 s per {MIN_BODY_RATE} bytes it sent", metavar="SECONDS",
        above=0)
    live_idle: float = setting(
        60.0, "close a live connection that sends nothing for this long while nothing is "
        "spoken, freeing its place in the line", metavar="SECONDS", above=0)
    live_context: int | None = setting(
        None, "backbone rows of a live conversation (its turns' text and audio); short of "
        "room, a new turn drops the oldest turns, the system and voice blocks kept (default: "
        "the model's own size, which the live 'started' event states)", metavar="ROWS", low=1)
    max_voices: int = setting(
        1000, "voices the voices directory may hold before POST /v1/audio/voices answers 409",
        metavar="N", low=1)
    # no flag: `serve` stores voices in the user's voices directory ($MOSS_TTS_VOICES)
    voices_root: str | os.PathLike | None = setting(None)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if kind_of(f.name) is tuple:        # a list given stays the frozen record's own
                object.__setattr__(self, f.name, tuple(value))
            elif value is not None or f.default is not None:
                within(f, value, f"{f.name} {value!r}")


@cache
def kind_of(name: str) -> type:
    """A field's type without None: `int | None` → int, `tuple[str, ...]` → tuple."""
    hint = get_type_hints(ServerSettings)[name]
    if get_origin(hint) in (Union, UnionType):
        hint = next(k for k in get_args(hint) if k is not type(None))
    return get_origin(hint) or hint


def within(f, value, name: str):
    """`value` of settings field `f` within its bounds and of its kind, or an InputError naming
    it `name` (the API: the field and value; the CLI: the text given)."""
    kind, meta = kind_of(f.name), f.metadata
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (kind is int and not isinstance(value, int)):
            raise InputError(f"{name} must be {'a whole number' if kind is int else 'a number'}")
        if meta["low"] is not None and value < meta["low"]:
            raise InputError(f"{name} must be at least {meta['low']}")
        if meta["above"] is not None and value <= meta["above"]:
            raise InputError(f"{name} must be above {meta['above']:g}")
        if meta["high"] is not None and value > meta["high"]:
            raise InputError(f"{name} must be at most {meta['high']}")
    elif kind is bool and not isinstance(value, bool):
        raise InputError(f"{name} must be true or false")
    return value


def flag_fields() -> list:
    """The fields `serve` has a flag for, in the order its --help lists them."""
    return [f for f in fields(ServerSettings) if f.metadata["help"] is not None]


def flag_of(f) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")
