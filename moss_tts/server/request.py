"""Request bodies of the speech server: JSON only, read under a size limit and a deadline,
parsed with bounded depth, and every field checked by name. A failure is a `RequestError`
carrying its HTTP status.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import math
from dataclasses import dataclass

from ..audio import REFERENCE_MAX_SECONDS, read_audio
from ..errors import InputError
from ..knobs import SPELLINGS, kind_of, parse
from .formats import FORMATS, STREAMED_FORMATS, format_problem

MAX_INPUT_CHARS = 4096
MAX_UPLOAD_BYTES = 10 * 2**20        # decoded reference / voice audio
MAX_BODY_BYTES = 15 * 2**20          # that upload as base64 (×4/3) plus the other fields
# The body deadline (serve --body-timeout; Apache's mod_reqtimeout `body=20,MinRate=500` in
# kind): a body must have arrived --body-timeout s after the request began, plus 1 s for each
# MIN_BODY_RATE bytes it has sent, so a client that stalls or trickles (a byte every 2 s) is
# answered 408 and its connection freed, while a slow link still gets its largest body in
# (15 MiB at 8 KiB/s: 32 min, the most any body holds a connection)
MIN_BODY_RATE = 8 * 2**10            # bytes a second: 64 kbit/s, the slowest mobile uplink
# OpenAI's fields and this server's own; every knob of knobs.KNOBS (seed, sampling, budgets,
# prompt fields; OpenAI's `instructions` is the instruction knob) is a field too
SPEECH_FIELDS = ("model", "input", "voice", "response_format", "speed", "stream_format",
                 "pcm_layout", "reference_audio", *SPELLINGS)
VOICE_FIELDS = ("name", "audio", "model")


class RequestError(InputError):
    """A request the server refuses; `status` is its HTTP status (400, 413, 415)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SpeechRequest:
    model: str | None                # None: the server's first model
    text: str | None                 # None: a sound described by the `sound` knob instead
    response_format: str
    stream_format: str | None
    speed: float
    pcm_layout: str
    voice: str | None
    reference_audio: str | None      # base64, decoded by the model worker
    knobs: dict                      # knob name → value, for the knobs the request gave
    given_as: dict                   # knob name → the field that gave it (errors say that)


def check_content_type(headers) -> None:
    """JSON POSTs only: a cross-site page can send text/plain without asking (no CORS preflight)."""
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise RequestError(415, f"Content-Type must be application/json, got {media or 'none'!r}")


async def read_body(request, *, timeout: float, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` (never read whole first), and
    with 408 once it is late: `timeout` s after this call, plus 1 s per MIN_BODY_RATE bytes
    received (the route calls it as the request begins)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body is {declared} bytes; the limit is {limit}")
    loop = asyncio.get_running_loop()
    start = loop.time()
    parts, size, stream = [], 0, request.stream()
    while True:
        late = start + timeout + size / MIN_BODY_RATE
        try:
            part = await asyncio.wait_for(anext(stream), max(late - loop.time(), 0))
        except StopAsyncIteration:
            return b"".join(parts)
        except asyncio.TimeoutError:
            raise RequestError(408, f"the body came too slowly ({size} bytes in "
                                    f"{loop.time() - start:.0f} s): a body must arrive within "
                                    f"{timeout:g} s, plus 1 s per {MIN_BODY_RATE} bytes "
                                    "(serve --body-timeout)") from None
        size += len(part)
        if size > limit:
            raise RequestError(413, f"the body is larger than {limit} bytes")
        parts.append(part)


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_object(raw: bytes, allowed: tuple[str, ...]) -> dict:
    """A JSON object with only `allowed` keys; invalid JSON, NaN/Infinity, deep nesting or a
    non-object → 400."""
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise RequestError(400, "the JSON body is nested too deeply") from None
    except ValueError as e:  # includes UnicodeDecodeError
        raise RequestError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a JSON object, got {kind_of(body)}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise RequestError(400, f"unknown field {unknown[0]!r}; accepted: {', '.join(allowed)}")
    return body


def string_field(body: dict, name: str, default: str | None = None,
            choices: tuple[str, ...] | None = None) -> str | None:
    """Field `name` of a parsed body: a string (one of `choices` when given), or `default` when
    absent or null; anything else → 400 naming the field."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise RequestError(400, f"'{name}' must be a string, got {kind_of(value)}")
    if choices is not None and value not in choices:
        raise RequestError(400, f"'{name}' must be one of {', '.join(choices)}; got {value!r}")
    return value


def number_field(body: dict, name: str, default, low, high, *, integer: bool = False,
            low_open: bool = False):
    """A number in [low, high] ((low, high] with low_open); bool is not a number here."""
    value = body.get(name)
    if value is None:
        return default
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise RequestError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, "
                                f"got {kind_of(value)}")
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        bounds = f"{'(' if low_open else '['}{low}, {high}]"
        raise RequestError(400, f"'{name}' must be in {bounds}, got {value}")
    return value


def parse_speech(raw: bytes) -> SpeechRequest:
    """POST /v1/audio/speech → a checked request (OpenAI fields plus this server's extensions)."""
    body = parse_object(raw, SPEECH_FIELDS)
    text = body.get("input")
    if text is None and body.get("sound") is not None:
        pass                 # a sound effect described by `sound` (or `input`) has no text
    elif not isinstance(text, str):
        raise RequestError(400, f"'input' must be a string, got {kind_of(text)}")
    elif not text.strip():
        raise RequestError(400, "'input' is empty: give the text to speak")
    elif len(text) > MAX_INPUT_CHARS:
        raise RequestError(413, f"'input' is longer than {MAX_INPUT_CHARS} characters")
    stream_format = string_field(body, "stream_format", None, ("sse", "audio"))
    fmt = string_field(body, "response_format", "pcm" if stream_format == "sse" else "mp3",
                       FORMATS)
    problem = format_problem(fmt)
    if problem:
        raise RequestError(400, problem)
    if stream_format == "audio" and fmt not in STREAMED_FORMATS:
        raise RequestError(400, f"stream_format 'audio' streams {' or '.join(STREAMED_FORMATS)}, "
                                f"not {fmt}; leave stream_format out for a whole {fmt} file")
    if stream_format == "sse" and fmt != "pcm":
        raise RequestError(400, "stream_format 'sse' carries base64 pcm: use response_format pcm")
    speed = float(number_field(body, "speed", 1.0, 0.25, 4.0))
    if stream_format is not None and speed != 1.0:
        raise RequestError(400, "'speed' is applied after synthesis: it cannot be streamed")
    return SpeechRequest(
        model=string_field(body, "model"),
        text=text, response_format=fmt, stream_format=stream_format, speed=speed,
        pcm_layout=string_field(body, "pcm_layout", "openai", ("openai", "native")),
        voice=string_field(body, "voice"), reference_audio=string_field(body, "reference_audio"),
        **knob_fields(body))


def knob_fields(body: dict) -> dict:
    """The knobs a request gave (by any of their spellings) → {"knobs": knob name → value,
    "given_as": knob name → spelling}, each value of its type and within the bounds every
    family shares (a family's own are checked when the model is known); a knob given twice
    (`instructions` and `instruction`) is refused."""
    out, given_as = {}, {}
    for spelling, knob in SPELLINGS.items():
        if body.get(spelling) is None:
            continue
        if knob.name in out:
            raise RequestError(400, f"'{spelling}' and '{knob.name}' are the same field: give "
                                    "one")
        try:
            value = parse(knob, body[spelling], "request", from_text=False)
        except InputError as e:
            raise RequestError(400, str(e).replace(repr(knob.name), repr(spelling), 1)) from None
        if knob.kind is str:
            value = value.strip() or None      # an empty instruction means none
        out[knob.name], given_as[knob.name] = value, spelling
    return {"knobs": {k: v for k, v in out.items() if v is not None}, "given_as": given_as}


def parse_voice(raw: bytes) -> tuple[str, str, str | None]:
    """POST /v1/audio/voices → (name, base64 audio, the model whose codec encodes it: None for
    the first); the name's rules are checked by voices.py."""
    body = parse_object(raw, VOICE_FIELDS)
    name, audio = body.get("name"), body.get("audio")
    if not isinstance(name, str):
        raise RequestError(400, f"'name' must be a string, got {kind_of(name)}")
    if not isinstance(audio, str) or not audio:
        raise RequestError(400, "'audio' must be a base64 WAV/FLAC file, got "
                                f"{kind_of(audio) if not isinstance(audio, str) else 'nothing'}")
    return name, audio, string_field(body, "model")


def decode_upload(data: str, what: str):
    """base64 WAV/FLAC → (samples float32 [n, channels], rate): its first REFERENCE_MAX_SECONDS,
    as every upload is a voice (reference_audio, a voice's audio, a speaker's), and never more
    (audio.read_audio checks the header and reads no further: a 300 KB FLAC can hold 100 M
    samples). Runs in the model worker: a 10 MiB upload takes long enough to stall the event
    loop."""
    if len(data) > MAX_UPLOAD_BYTES * 4 // 3 + 4:
        raise RequestError(413, f"'{what}' is larger than {MAX_UPLOAD_BYTES // 2**20} MiB")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, f"'{what}' is not valid base64") from None
    try:
        return read_audio(io.BytesIO(raw), max_seconds=REFERENCE_MAX_SECONDS, name=f"'{what}'")
    except InputError as e:
        raise RequestError(400, str(e)) from None
