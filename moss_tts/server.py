"""`python -m moss_tts serve`: an OpenAI-style speech API over one or more loaded TTS models
(any family: the TTS protocol of tts.py), picked by the request's `model`.

Starlette + uvicorn: a small ASGI core with streaming responses and no framework magic, and
uvicorn is the de-facto server for it. All model work (synthesis, reference decode + encode,
voice uploads) runs on its model's worker thread behind a bounded line (server_worker.py), so
one model object is never used by two threads; a full line
answers 503 with Retry-After. Requests are checked before any work (server_request.py), access
rules sit in front (server_access.py), audio encodings in server_formats.py.

Endpoints: POST /v1/audio/speech, WebSocket /v1/audio/live (server_live.py), GET /v1/models,
GET/POST/DELETE /v1/audio/voices, GET /health, and a browser page at / (moss_tts/web_page.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import threading

import numpy as np

from .audio import time_stretch
from .errors import InputError, MossTTSError
from .knobs import synthesis_keywords
from .server_access import LOOPBACK_NAMES, AccessLog, Gate, error_body, host_name
from .server_formats import MEDIA_TYPES, PcmLayout, encode_audio, wav_stream_header
from .server_request import (RequestError, check_content_type, decode_upload, parse_speech,
                             parse_voice, read_body)
from .server_worker import AudioChannel, ModelWorker

logger = logging.getLogger(__name__)

WRITE_TIMEOUT = 15.0     # seconds a streamed response may wait for its client to read
STREAM_BUFFER = 32       # chunks (frames) buffered per streaming client
# OpenAI's model names: a request naming one (or none) is served by the first model
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def error_response(status: int, message: str, **headers):
    from starlette.responses import Response

    return Response(error_body(status, message), status_code=status, headers=headers or None,
                    media_type="application/json")


def failure_response(e: BaseException):
    """A job's exception → 4xx for the caller's mistakes, 500 (logged) for ours."""
    if isinstance(e, RequestError):
        return error_response(e.status, first_line(e))
    if isinstance(e, MossTTSError):
        return error_response(400, first_line(e))
    logger.error("speech request failed", exc_info=e)
    return error_response(500, f"internal error: {first_line(e)}")


def busy_response():
    return error_response(503, "busy: too many requests are waiting", **{"Retry-After": "2"})


async def no_response(scope, receive, send) -> None:
    """For a client that already left: nothing can be delivered."""


async def client_gone(receive) -> None:
    """Returns when the client disconnects (the body has been read: nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(receive, awaitable):
    """(True, result) or (False, None) when the client left first."""
    task, gone = asyncio.ensure_future(awaitable), asyncio.ensure_future(client_gone(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    return False, None


class StreamEncoder:
    """Native audio chunks → the bytes of one streamed response: SSE events of base64 pcm, raw
    pcm, or a streamable WAV (header first, then native s16le)."""

    def __init__(self, stream_format: str, fmt: str, pcm_layout: str, rate: int, channels: int):
        self.sse = stream_format == "sse"
        self.layout = PcmLayout("native" if fmt == "wav" else pcm_layout, rate, channels)
        self.header = wav_stream_header(self.layout.rate, self.layout.channels) \
            if fmt == "wav" else b""
        self.media_type = "text/event-stream" if self.sse else MEDIA_TYPES[fmt]

    def _wrap(self, pcm: bytes) -> bytes:
        if not self.sse:
            return pcm
        if not pcm:
            return b""
        event = {"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode()}
        return f"data: {json.dumps(event)}\n\n".encode()

    def chunk(self, audio: np.ndarray) -> bytes:
        head, self.header = self.header, b""
        return head + self._wrap(self.layout.push(audio))

    def end(self) -> bytes:
        tail = self.header + self._wrap(self.layout.flush())
        if self.sse:
            tail += f"data: {json.dumps({'type': 'speech.audio.done'})}\n\n".encode()
        return tail

    def error(self, message: str) -> bytes | None:
        """The SSE error event; None for raw audio, which can only end abruptly."""
        if not self.sse:
            return None
        event = {"type": "error", "error": {"message": message}}
        return f"event: error\ndata: {json.dumps(event)}\n\n".encode()


class AudioStream:
    """A streamed response fed by an AudioChannel. A client that leaves, or whose socket stays
    full for `timeout` s, is dropped and its generation cancelled."""

    def __init__(self, first, channel: AudioChannel, encoder: StreamEncoder, timeout: float):
        self.first, self.channel, self.encoder, self.timeout = first, channel, encoder, timeout

    async def __call__(self, scope, receive, send):
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(client_gone(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.channel.cancelled.set()      # the worker stops at its next chunk
            pump.cancel()
            gone.cancel()

    async def _send(self, send, body: bytes, more: bool) -> bool:
        try:
            await asyncio.wait_for(send({"type": "http.response.body", "body": body,
                                         "more_body": more}), self.timeout)
            return True
        except asyncio.TimeoutError:
            logger.warning("dropped a streaming client that stopped reading for %.0f s",
                           self.timeout)
            return False

    async def _pump(self, send):
        r = self.encoder.layout
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", self.encoder.media_type.encode()), (b"cache-control", b"no-cache"),
            (b"x-audio-sample-rate", str(r.rate).encode()),
            (b"x-audio-channels", str(r.channels).encode())]})
        kind, value = self.first
        while kind == "audio":
            if not await self._send(send, self.encoder.chunk(value), True):
                return
            kind, value = await self.channel.get()
        if kind == "end":
            await self._send(send, self.encoder.end(), False)
            return
        logger.error("speech stream failed after it started: %s", first_line(value),
                     exc_info=value if not isinstance(value, MossTTSError) else None)
        event = self.encoder.error(first_line(value))
        if event is not None:
            await self._send(send, event, False)
        # raw audio: returning unfinished makes the server close the connection mid-body


class ServedModel:
    """One loaded TTS behind its own worker, and what the event loop may know of it without
    touching it (only the worker thread uses the model)."""

    def __init__(self, name: str, tts, queue_depth: int, thread_name: str):
        from .models.registry import family

        self.name, self.sample_rate, self.channels = name, tts.sample_rate, tts.channels
        self.family = family(type(tts).FAMILY)
        self.live = callable(getattr(type(tts), "session", None))   # /v1/audio/live serves it
        self.worker = ModelWorker(tts, queue_depth, thread_name)

    def stream_keywords(self, req) -> dict:
        """`stream`'s keywords for a request's knobs: the family's options over its defaults,
        each knob checked against the family's own bounds. OpenAI clients send `instructions`
        to any model: a family without a style prompt ignores it."""
        try:
            return synthesis_keywords(self.family, req.knobs, "request",
                                      lenient=("instruction",), given_as=req.given_as)
        except InputError as e:
            raise RequestError(400, first_line(e)) from None


def served_models(models, queue_depth: int) -> dict[str, ServedModel]:
    """name → ServedModel, the first being the default; each model gets its own worker."""
    return {name: ServedModel(name, tts, queue_depth,
                              "moss-tts-model" if i == 0 else f"moss-tts-model-{name}")
            for i, (name, tts) in enumerate(models.items())}


def pick_model(served: dict, name: str | None) -> ServedModel:
    """The request's model: by its name; OpenAI's names (or none) mean the first."""
    if name is None or name in OPENAI_MODELS:
        return next(iter(served.values()))
    if name not in served:
        raise RequestError(400, f"unknown model {name!r}; available: {', '.join(served)} "
                                f"(or {', '.join(OPENAI_MODELS)} for {next(iter(served))})")
    return served[name]


def create_app(tts, *, model_name: str = "moss-tts-nano", queue_depth: int = 4,
               voices_root=None, api_key: str | None = None, cors_origins=(),
               allowed_hosts=(), bind_host: str = "127.0.0.1", access_log: bool = False,
               write_timeout: float | None = None):
    """The ASGI app over a loaded TTS (`model_name` names it), or over several: `tts` a dict
    name → TTS, the first being the default. Only a model's worker thread touches it after
    this call; a voice upload is encoded by the codec of the model it names (default: the
    first), and a voice is refused by a model whose codec did not make it."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route, WebSocketRoute

    from .server_live import live_endpoint
    from .voices import add_voice, check_name, codec_info, list_voices, remove_voice

    served = served_models(tts if isinstance(tts, dict) else {model_name: tts}, queue_depth)
    default = next(iter(served.values()))
    write_timeout = write_timeout or WRITE_TIMEOUT

    def reference_for(model, req):
        """Worker side: the request's voice, from uploaded audio or a stored name."""
        if req.reference_audio:
            return model.encode_reference(*decode_upload(req.reference_audio, "reference_audio"))
        if req.voice and req.voice in {v["name"] for v in list_voices(voices_root)}:
            return model.voice(req.voice, root=voices_root)
        return None   # OpenAI's voice names (alloy, ...) fall back to the default voice

    def generate(model, req, words):
        return model.stream(req.text, reference=reference_for(model, req), **words)

    async def whole(request, req, served_model):
        cancel = threading.Event()

        words = served_model.stream_keywords(req)

        def job(model):
            parts = []
            for part in generate(model, req, words):
                if cancel.is_set():       # the client left: stop generating
                    return None
                parts.append(part)
            return np.concatenate(parts) if parts else \
                np.zeros((0, served_model.channels), np.float32)

        future = served_model.worker.submit(job)
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

    async def streamed(request, req, served_model):
        channel = AudioChannel(asyncio.get_running_loop(), STREAM_BUFFER, write_timeout)
        words = served_model.stream_keywords(req)

        def job(model):
            if channel.cancelled.is_set():      # the client left while this waited
                return
            try:
                for part in generate(model, req, words):
                    if not channel.put(part):
                        if channel.stalled:
                            logger.warning("a streaming client stopped reading; its synthesis "
                                           "was cancelled after %.0f s", write_timeout)
                        return
                channel.finish("end")
            except Exception as e:  # reported to the client by the response
                channel.finish("error", e)

        if served_model.worker.submit(job) is None:
            return busy_response()
        # headers wait for the first audio, so errors before it are plain 4xx answers
        stayed, first = await unless_client_leaves(request.receive, channel.get())
        if not stayed:
            channel.cancelled.set()
            return no_response
        if first[0] == "error":
            return failure_response(first[1])
        encoder = StreamEncoder(req.stream_format, req.response_format, req.pcm_layout,
                                served_model.sample_rate, served_model.channels)
        return AudioStream(first, channel, encoder, write_timeout)

    async def speech(request):
        try:
            check_content_type(request.headers)
            req = parse_speech(await read_body(request))
            served_model = pick_model(served, req.model)
            return await (whole(request, req, served_model) if req.stream_format is None
                          else streamed(request, req, served_model))
        except RequestError as e:
            return error_response(e.status, first_line(e))

    async def upload_voice(request):
        try:
            check_content_type(request.headers)
            name, audio, model_name = parse_voice(await read_body(request))
            check_name(name)
            owner = pick_model(served, model_name)
        except (RequestError, InputError) as e:
            return error_response(getattr(e, "status", 400), first_line(e))

        def job(model):
            ref = model.encode_reference(*decode_upload(audio, "audio"))
            add_voice(name, ref.codes, {"source": "upload", "model": owner.name} |
                      codec_info(model.codec), root=voices_root)
            return int(ref.codes.shape[0])

        future = owner.worker.submit(job)
        if future is None:
            return busy_response()
        try:
            stayed, frames = await unless_client_leaves(request.receive,
                                                        asyncio.wrap_future(future))
        except Exception as e:  # the job's own failure
            return failure_response(e)
        if not stayed:
            future.cancel()
            return no_response
        return JSONResponse({"name": name, "frames": frames}, status_code=201)

    async def voices(request):
        return JSONResponse({"voices": list_voices(voices_root)})

    async def delete_voice(request):
        name = request.path_params["name"]
        try:
            remove_voice(name, root=voices_root)
        except InputError as e:
            return error_response(404 if "no voice" in str(e) else 400, first_line(e))
        return JSONResponse({"deleted": name})

    async def page(request):
        from .web_page import PAGE
        return HTMLResponse(PAGE)

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "moss-tts", "sample_rate": m.sample_rate,
             "channels": m.channels, "live": m.live} for name, m in served.items()]})

    async def health(request):
        return JSONResponse({"status": "ok", "sample_rate": default.sample_rate,
                             "channels": default.channels})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        for m in served.values():
            await asyncio.to_thread(m.worker.close)

    app = Starlette(routes=[
        Route("/", page, methods=["GET"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/audio/voices", voices, methods=["GET"]),
        Route("/v1/audio/voices", upload_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name}", delete_voice, methods=["DELETE"]),
        Route("/health", health, methods=["GET"]),
        WebSocketRoute("/v1/audio/live", live_endpoint(served, pick_model, reference_for,
                                                       write_timeout)),
    ], lifespan=lifespan)
    hosts = {h.lower() for h in (*LOOPBACK_NAMES, host_name(bind_host), *allowed_hosts)}
    gated = Gate(app, hosts=hosts, origins=set(cors_origins), api_key=api_key or None)
    return AccessLog(gated) if access_log else gated
