"""`python -m moss_tts serve`: an OpenAI-style speech API over one NanoTTS instance.

Starlette + uvicorn: a small ASGI core with streaming responses and no framework magic, and
uvicorn is the de-facto server for it. One model serializes synthesis (ggml graphs and caches
are per instance) behind a bounded queue; a full queue answers 503 with Retry-After.

Endpoints: POST /v1/audio/speech, GET /v1/models, GET/POST/DELETE /v1/audio/voices, GET /health,
and a browser page at / (moss_tts/web_page.py).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import threading

import numpy as np

from .audio import resample, time_stretch, to_channels
from .errors import InputError, MossTTSError
from .sampling import SamplingOptions

logger = logging.getLogger(__name__)

MAX_INPUT_CHARS = 4096
MAX_UPLOAD_BYTES = 10 * 2**20
FORMATS = {"wav": "audio/wav", "flac": "audio/flac", "pcm": "audio/L16"}
OPENAI_PCM_RATE = 24000


class SynthesisQueue:
    """One synthesis at a time, at most `depth` waiting; `None` when full."""

    def __init__(self, depth: int):
        self._slots = threading.BoundedSemaphore(depth + 1)
        self._run = threading.Lock()

    def try_enter(self) -> bool:
        return self._slots.acquire(blocking=False)

    def leave(self) -> None:
        self._slots.release()

    def __enter__(self):
        self._run.acquire()
        return self

    def __exit__(self, *exc):
        self._run.release()


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Whole-response encodings: WAV (float32), FLAC (24-bit), pcm (s16le interleaved)."""
    import soundfile as sf

    if fmt == "pcm":
        return (np.round(np.clip(samples, -1, 1) * 32767).astype("<i2")).tobytes()
    buf = io.BytesIO()
    sf.write(buf, np.asarray(samples, np.float32), sample_rate,
             format="WAV" if fmt == "wav" else "FLAC",
             subtype="FLOAT" if fmt == "wav" else "PCM_24")
    return buf.getvalue()


def create_app(tts, *, model_name: str = "moss-tts-nano", queue_depth: int = 4,
               voices_root=None):
    """The ASGI app over a loaded NanoTTS (or anything with its synthesize/stream API)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from .models.nano_tts import Reference
    from .voices import add_voice, list_voices, load_voice, remove_voice

    queue = SynthesisQueue(queue_depth)
    sr = tts.sample_rate

    def error(status: int, message: str, **headers) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error"
                                       if status < 500 else "server_error"}},
                            status_code=status, headers=headers or None)

    def parse_request(body: dict):
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise InputError("'input' must be non-empty text")
        if len(text) > MAX_INPUT_CHARS:
            raise OverflowError(f"'input' is longer than {MAX_INPUT_CHARS} characters")
        fmt = body.get("response_format", "wav")
        if fmt not in FORMATS:
            raise InputError(f"response_format {fmt!r} is not supported (use wav, flac or pcm)")
        speed = float(body.get("speed", 1.0))
        if not 0.25 <= speed <= 4.0:
            raise InputError(f"speed must be between 0.25 and 4.0, got {speed}")
        stream_format = body.get("stream_format")
        if stream_format not in (None, "sse", "audio"):
            raise InputError("stream_format must be 'sse' or 'audio'")
        if stream_format is not None and speed != 1.0:
            raise InputError("speed is applied after synthesis: it cannot be streamed")
        openai_pcm = body.get("pcm_layout") == "openai"  # 24 kHz mono s16le, for strict clients
        if openai_pcm and (fmt != "pcm" or stream_format is not None):
            raise InputError("pcm_layout 'openai' goes with response_format 'pcm', not streamed")
        options = SamplingOptions(
            audio_temperature=float(body.get("temperature", 0.8)),
            audio_top_k=body.get("top_k", 25), audio_top_p=float(body.get("top_p", 0.95)),
            audio_repetition_penalty=float(body.get("repetition_penalty", 1.2)))
        reference = None
        if body.get("reference_audio"):
            raw = base64.b64decode(body["reference_audio"], validate=True)
            if len(raw) > MAX_UPLOAD_BYTES:
                raise OverflowError("reference_audio is larger than 10 MiB")
            import soundfile as sf
            try:
                samples, rate = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
            except Exception:
                raise InputError("reference_audio is not a readable WAV/FLAC file") from None
            reference = tts.encode_reference(samples, rate)
        elif body.get("voice") and body["voice"] in {v["name"] for v in list_voices(voices_root)}:
            codes, _ = load_voice(body["voice"], root=voices_root)
            reference = Reference(codes[:, : tts.config.n_vq])
        kwargs = dict(reference=reference, options=options, seed=body.get("seed"),
                      max_frames=int(body.get("max_new_frames", 1000)))
        return text, fmt, stream_format, kwargs, speed, openai_pcm

    async def speech(request):
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise InputError("the body must be a JSON object")
            text, fmt, stream_format, kwargs, speed, openai_pcm = parse_request(body)
        except OverflowError as e:
            return error(413, str(e))
        except (MossTTSError, ValueError, TypeError) as e:
            return error(400, str(e).splitlines()[0] if str(e) else type(e).__name__)
        if not queue.try_enter():
            return error(503, "busy: too many requests are waiting", **{"Retry-After": "2"})
        headers = {"X-Audio-Sample-Rate": str(sr), "X-Audio-Channels": "2"}
        if stream_format is None:
            try:
                def run():
                    with queue:
                        return tts.synthesize(text, **kwargs)[0]
                audio = await asyncio.to_thread(run)
            except MossTTSError as e:
                return error(400, str(e))
            finally:
                queue.leave()
            # post-hoc, pitch-preserving tempo change, then the OpenAI pcm layout if asked for
            audio = time_stretch(audio, speed, sr)
            rate = sr
            if openai_pcm:
                audio, rate = resample(to_channels(audio, 1), sr, OPENAI_PCM_RATE), OPENAI_PCM_RATE
                headers = {"X-Audio-Sample-Rate": str(rate), "X-Audio-Channels": "1"}
            return Response(encode_audio(audio, rate, fmt), media_type=FORMATS[fmt], headers=headers)
        return StreamingResponse(stream_chunks(text, kwargs, stream_format), headers=headers,
                                 media_type="text/event-stream" if stream_format == "sse"
                                 else "audio/L16")

    async def stream_chunks(text, kwargs, stream_format):
        """Generation runs in a worker thread; chunks cross over an asyncio queue. A client that
        goes away stops the generator (the worker sees `cancelled` at the next chunk)."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue(maxsize=64)
        cancelled = threading.Event()

        def produce():
            try:
                with queue:
                    for part in tts.stream(text, **kwargs):
                        if cancelled.is_set():
                            return
                        asyncio.run_coroutine_threadsafe(chunks.put(part), loop).result()
            except MossTTSError as e:
                asyncio.run_coroutine_threadsafe(chunks.put(e), loop).result()
            finally:
                queue.leave()
                asyncio.run_coroutine_threadsafe(chunks.put(None), loop)

        worker = loop.run_in_executor(None, produce)
        try:
            while True:
                part = await chunks.get()
                if part is None:
                    break
                if isinstance(part, Exception):
                    if stream_format == "sse":
                        yield f"event: error\ndata: {json.dumps({'message': str(part)})}\n\n".encode()
                    break
                pcm = encode_audio(part, sr, "pcm")
                if stream_format == "sse":
                    event = {"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode()}
                    yield f"data: {json.dumps(event)}\n\n".encode()
                else:
                    yield pcm
            if stream_format == "sse":
                yield f"data: {json.dumps({'type': 'speech.audio.done'})}\n\n".encode()
        finally:
            cancelled.set()
            while not worker.done():  # drain so the worker is never stuck on a full queue
                try:
                    chunks.get_nowait()
                except asyncio.QueueEmpty:
                    await asyncio.sleep(0.01)

    async def page(request):
        from .web_page import PAGE
        return HTMLResponse(PAGE)

    async def models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "owned_by": "moss-tts"}]})

    async def health(request):
        return JSONResponse({"status": "ok", "sample_rate": sr, "channels": 2})

    async def voices(request):
        if request.method == "GET":
            return JSONResponse({"voices": list_voices(voices_root)})
        if request.method == "DELETE":
            try:
                remove_voice(request.path_params.get("name", ""), root=voices_root)
            except InputError as e:
                return error(404 if "no voice" in str(e) else 400, str(e))
            return JSONResponse({"deleted": request.path_params.get("name")})
        try:
            body = await request.json()
            raw = base64.b64decode(body.get("audio", ""), validate=True)
            if len(raw) > MAX_UPLOAD_BYTES:
                return error(413, "audio is larger than 10 MiB")
            import soundfile as sf
            try:
                samples, rate = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
            except Exception:
                raise InputError("audio is not a readable WAV/FLAC file") from None
            def encode():
                with queue:   # the model (and its codec's encoder) serves one caller at a time
                    return tts.encode_reference(samples, rate)

            ref = await asyncio.to_thread(encode)
            add_voice(str(body.get("name", "")), ref.codes, {"source": "upload"},
                      root=voices_root)
        except (MossTTSError, ValueError, TypeError) as e:
            return error(400, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return JSONResponse({"name": body["name"], "frames": int(ref.codes.shape[0])}, status_code=201)

    return Starlette(routes=[
        Route("/", page, methods=["GET"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/audio/voices", voices, methods=["GET", "POST"]),
        Route("/v1/audio/voices/{name}", voices, methods=["DELETE"]),
        Route("/health", health, methods=["GET"]),
    ])
