"""`python -m moss_tts serve`: an OpenAI-style speech API over one or more loaded TTS models
(any family: the TTS protocol of models/tts.py), picked by the request's `model`.

Starlette + uvicorn: a small ASGI core with streaming responses and no framework magic, and
uvicorn is the de-facto server for it. This module holds the routes, as module functions over
the app's registry of served models (served.py, kept in `app.state.served`). All model work
(synthesis, reference decode + encode, voice uploads) runs on its model's worker thread behind
a bounded line (worker.py), so one model object is never used by two threads; a full line
answers 503 with Retry-After. Requests are checked before any work (request.py), access rules
sit in front (access.py), audio encodings are in formats.py, answers in responses.py, and
stored voices are listed from an index (voice_index.py). No exception reaches Starlette's or
uvicorn's plain-text 500: the Guard (responses.py) answers it in OpenAI's shape.

Endpoints: POST /v1/audio/speech, WebSocket /v1/audio/live (live.py), GET /v1/models,
GET/POST/DELETE /v1/audio/voices, GET /health, and a browser page at / (page.html).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Future
from functools import cache
from importlib import resources

import numpy as np

from ..audio import time_stretch
from ..errors import BackendLost, InputError
from ..knobs import renamed
from ..voices import check_name
from .access import AccessLog, Gate, quiet_uvicorn_denials, served_hosts
from .formats import MEDIA_TYPES, PcmLayout, StreamEncoder, encode_audio
from .hosted import describe
from .live import live_endpoint
from .request import (MAX_INPUT_CHARS, RequestError, check_content_type, decode_upload,
                      parse_speech, parse_voice, read_body)
from .responses import (AudioStream, Guard, busy_response, error_response, failure_response,
                        first_line, no_response, unless_client_leaves)
from .served import ServedModels, served_name
from .settings import ServerSettings
from .warned import pulled_for, request_name, route_warnings
from .worker import AudioChannel

logger = logging.getLogger(__name__)

STREAM_BUFFER = 32       # chunks (frames) buffered per streaming client


def create_app(tts, settings: ServerSettings = ServerSettings()):
    """The ASGI app over loaded TTS models: `tts` a dict name → TTS, the first being the
    default, or one TTS, served under its family's name (served.py served_name). Only a
    model's worker thread touches a model after this call; a voice upload is encoded by the
    codec of the model it names (default: the first), and a voice is refused by a model whose
    codec did not make it, or when `settings.max_voices` are stored. `settings` are serve's
    flags (settings.py): the line and stream places of each model (worker.py), the access
    rules (access.py), the deadlines and the live limits (live.py)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route, WebSocketRoute

    app = Starlette(routes=[
        Route("/", page, methods=["GET"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/audio/voices", voices, methods=["GET"]),
        Route("/v1/audio/voices", upload_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name}", delete_voice, methods=["DELETE"]),
        Route("/health", health, methods=["GET"]),
        WebSocketRoute("/v1/audio/live", live_endpoint),
    ], lifespan=lifespan, middleware=[Middleware(Guard)],
        exception_handlers={404: no_endpoint, 405: no_endpoint})
    app.router.redirect_slashes = False       # one spelling per endpoint: see no_endpoint
    named = tts if isinstance(tts, dict) else {served_name(describe(tts).family): tts}
    app.state.served = ServedModels(named, settings)
    quiet_uvicorn_denials()
    route_warnings()        # a model's warnings while serving a request: one log line each
    gated = Guard(Gate(app, hosts=served_hosts(settings.host, settings.allowed_hosts),
                       origins=set(settings.cors_origins), api_key=settings.api_key or None))
    return AccessLog(gated) if settings.access_log else gated


@contextlib.asynccontextmanager
async def lifespan(app):
    yield
    await asyncio.to_thread(app.state.served.close)


# --- routes -------------------------------------------------------------------------------------


async def speech(request):
    served = request.app.state.served
    try:
        check_content_type(request.headers)
        req = parse_speech(await read_body(request, timeout=served.settings.body_timeout))
        model = served.pick(req.model)
        model.check_available()
        return await (whole(request, served, model, req) if req.stream_format is None
                      else streamed(request, served, model, req))
    except (RequestError, BackendLost) as e:
        return failure_response(e)


async def upload_voice(request):
    from starlette.responses import JSONResponse

    served = request.app.state.served
    try:
        check_content_type(request.headers)
        name, audio, model_name = parse_voice(
            await read_body(request, timeout=served.settings.body_timeout))
        check_name(name)
        owner = served.pick(model_name)
        owner.check_available()
        await asyncio.to_thread(served.voices.check_room, name)   # before audio is decoded
    except (RequestError, InputError, BackendLost) as e:
        return failure_response(e)

    def job(model):
        ref = model.encode_reference(*decode_upload(audio, "audio"))
        served.voices.add(name, ref.codes, {"source": "upload", "model": owner.name} |
                          owner.codec)
        return int(ref.codes.shape[0])

    future = owner.worker.submit(job)
    if future is None:
        return busy_response()
    try:
        stayed, frames = await unless_client_leaves(request.receive, asyncio.wrap_future(future))
    except Exception as e:  # the job's own failure
        return failure_response(e)
    if not stayed:
        future.cancel()
        return no_response
    return JSONResponse({"name": name, "frames": frames}, status_code=201)


async def voices(request):
    from starlette.responses import JSONResponse

    # from the index, in a thread: the event loop never reads voice files
    listing = await asyncio.to_thread(request.app.state.served.voices.listing)
    return JSONResponse({"voices": listing})


async def delete_voice(request):
    from starlette.responses import JSONResponse

    name = request.path_params["name"]
    try:
        await asyncio.to_thread(request.app.state.served.voices.remove, name)
    except InputError as e:
        return error_response(404 if "no voice" in str(e) else 400, first_line(e))
    return JSONResponse({"deleted": name})


async def page(request):
    from starlette.responses import HTMLResponse

    return HTMLResponse(page_html())


@cache
def page_html() -> str:
    """The browser page, package data beside this module (pyproject's package-data)."""
    return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")


async def models(request):
    from starlette.responses import JSONResponse

    return JSONResponse({"object": "list", "data": [
        {"id": name, "object": "model", "owned_by": "moss-tts", "sample_rate": m.sample_rate,
         "channels": m.channels, "live": m.live, "codec": m.codec,
         "max_input_chars": MAX_INPUT_CHARS,     # of `input`, and of a live message's text
         "fields": m.fields, "required": m.required,     # served.py: what it takes
         "free_places": m.worker.free_places} | m.status()
        for name, m in request.app.state.served.models.items()]})


async def no_endpoint(request, exc):
    """Starlette's 404 (no route) and 405 (a route without that method) in OpenAI's error
    shape, saying what is served. A path with a trailing '/' is a 404 naming the path without
    it, not Starlette's plain-text 307 redirect: an API has one spelling per endpoint, clients
    differ on following a redirect (httpx and curl do not by default), and a followed POST
    would send its body, up to 15 MiB, a second time."""
    from starlette.routing import Match, WebSocketRoute

    routes, path, method = request.app.routes, request.scope["path"], request.method
    shown = path if len(path) <= 100 else path[:100] + "…"
    http = [r for r in routes if not isinstance(r, WebSocketRoute)]
    allowed = sorted({m for r in http if r.matches(request.scope)[0] is not Match.NONE
                      for m in r.methods})
    if exc.status_code == 405 and allowed:
        return error_response(405, f"{method} is not served at {shown}; it takes "
                                   f"{', '.join(allowed)}", Allow=", ".join(allowed))
    bare = dict(request.scope, path=path.rstrip("/") or "/")
    if bare["path"] != path and any(r.matches(bare)[0] is not Match.NONE for r in http):
        return error_response(404, f"no endpoint {shown}: the path is {bare['path']}, without "
                                   "the trailing '/'")
    endpoints = [f"{'/'.join(sorted(r.methods - {'HEAD'}))} {r.path}" for r in http]
    endpoints += [f"WebSocket {r.path}" for r in routes if isinstance(r, WebSocketRoute)]
    return error_response(404, f"no endpoint {method} {shown}; this server serves "
                               f"{', '.join(endpoints)}")


async def health(request):
    """200 while the default model serves ("ok", or "degraded" naming the other models whose
    backend is lost), 503 "unavailable" while it does not: a balancer sends its requests
    elsewhere until the model is back."""
    from starlette.responses import JSONResponse

    served = request.app.state.served
    lost = {name: status for name, m in served.models.items()
            if not (status := m.status())["available"]}
    up = served.default.name not in lost
    body = {"status": "unavailable" if not up else "degraded" if lost else "ok",
            "sample_rate": served.default.sample_rate, "channels": served.default.channels}
    return JSONResponse(body | ({"unavailable": lost} if lost else {}),
                        status_code=200 if up else 503)


# --- speech: a whole file, or a stream ----------------------------------------------------------


def generate(served: ServedModels, served_model, model, req, words, name: str, *,
             whole: bool = False, progress=None):
    """Worker side: the request's audio chunks (`whole`: for a whole file, with the family's
    whole-audio keywords, as `synthesize`), what the model warns logged as `name`'s; the API's
    errors, raised as the stream is made or as it runs (a later text chunk's check), name the
    request's fields. `progress(done, total)`: told the steps of a family that reports them
    (an empty chunk comes after each, so the worker may serve others meanwhile)."""
    try:
        kw = served.stream_inputs(model, served_model, req, words)
        if progress is not None and served_model.progress:
            kw["progress"] = progress
        yield from pulled_for(name, model.stream(
            req.text, **(model.whole_keywords(kw) if whole else kw)))
    except RequestError:        # the server's own: already in the request's terms
        raise
    except InputError as e:
        raise renamed(e, "request", req.given_as) from None


async def whole(request, served: ServedModels, served_model, req):
    from starlette.responses import Response

    cancel = threading.Event()
    words = served_model.stream_keywords(req)
    name = request_name(request, served_model.name)

    def job(model):     # yields after each chunk: the worker may run others between them
        parts = []
        for part in generate(served, served_model, model, req, words, name, whole=True):
            if cancel.is_set():       # the client left: stop generating
                return None
            parts.append(part)
            yield
        return np.concatenate(parts) if parts else \
            np.zeros((0, served_model.channels), np.float32)

    future = served_model.worker.submit(job, stream=True)
    if future is None:
        return busy_response()
    waiting = asyncio.wrap_future(future)
    waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen, if left
    try:
        stayed, audio = await unless_client_leaves(request.receive, waiting)
    except Exception as e:  # the job's own failure
        return failure_response(e)
    if not stayed:
        cancel.set()
        future.cancel()
        logger.info("client left; its synthesis was cancelled")
        return no_response
    body, headers = await asyncio.to_thread(render_whole, audio, req, served_model)
    return Response(body, media_type=MEDIA_TYPES[req.response_format], headers=headers)


def render_whole(audio, req, served_model):
    sr = served_model.sample_rate
    audio = time_stretch(audio, req.speed, sr)  # post-hoc tempo change, pitch kept
    if req.response_format != "pcm":
        return encode_audio(audio, sr, req.response_format), {}
    layout = PcmLayout(req.pcm_layout, sr, served_model.channels)
    return layout.push(audio) + layout.flush(), {
        "X-Audio-Sample-Rate": str(layout.rate), "X-Audio-Channels": str(layout.channels)}


async def streamed(request, served: ServedModels, served_model, req):
    write_timeout = served.settings.write_timeout
    channel = AudioChannel(asyncio.get_running_loop(), STREAM_BUFFER, write_timeout)
    words = served_model.stream_keywords(req)
    name = request_name(request, served_model.name)

    def job(model):     # → whether the stream ended; its failure is the future's exception
        if channel.cancelled.is_set():      # the client left while this waited
            return False
        progress = channel.progress if req.stream_format == "sse" else None
        for part in generate(served, served_model, model, req, words, name, progress=progress):
            if not len(part):   # a sampler's step: nothing to send, but others may run now
                yield
                continue
            while (sent := channel.offer(part)) is None:
                yield channel   # its client has not read the buffer: the others go on
            if not sent:
                if channel.stalled:
                    logger.warning("a streaming client stopped reading; its synthesis "
                                   "was cancelled after %.0f s", write_timeout)
                return False
            yield       # the worker may pull the other running requests' chunks now
        return True

    future = served_model.worker.submit(job, stream=True)
    if future is None:
        return busy_response()
    future.add_done_callback(lambda done: last_item(channel, done))
    # headers wait for the first audio, so errors before it are plain 4xx answers
    stayed, first = await unless_client_leaves(request.receive, channel.get())
    if not stayed:
        channel.cancelled.set()
        return no_response
    if first[0] == "error":
        return failure_response(first[1])
    encoder = StreamEncoder(req.stream_format, req.response_format, req.pcm_layout,
                            served_model.sample_rate, served_model.channels)
    return AudioStream(first, channel, encoder)


def last_item(channel: AudioChannel, job: Future) -> None:
    """A stream job's end (or failure) into its channel, from its future: the worker settles
    that only once the job's place is free (worker.py `_finish`), so a client that has the
    stream's last bytes and asks again at once finds the line as free as it left it."""
    if job.cancelled():
        return
    if job.exception() is not None:
        channel.finish("error", job.exception())   # reported to the client by the response
    elif job.result():
        channel.finish("end")
