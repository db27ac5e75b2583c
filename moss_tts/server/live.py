"""The speech server's live endpoint, WebSocket /v1/audio/live: text deltas in as an LLM writes
them, s16le PCM out as it is made, one live session (MOSS-TTS-Realtime) per connection.

Protocol (all client messages are JSON text; the server sends JSON text events and binary audio):
  client → {"model", "voice", "reference_audio", "format": "pcm", and any knob the model
            takes: "seed", "temperature", ...}         the config, first and once (all optional)
  server → {"type": "started", "model", "sample_rate", "channels", "format": "pcm_s16le",
            "context": ROWS}                           the conversation's size (serve
                                                         --live-context), in backbone rows
  client → {"type": "text", "text": DELTA} ...           the assistant's text as it arrives
  server → binary s16le PCM chunks as audio is ready
  client → {"type": "end"}                               no more text this turn
  server → (the rest of the audio) {"type": "turn_done", "interrupted": false, "seconds": S,
            "context_left": ROWS}                      rows the conversation has left; with
                                                         "cut": "max_frames" when the turn's
                                                         audio ended at its frame budget
  server → {"type": "context_trimmed", "turns_dropped": N, "context_left"}   when a new turn
            found the context short of room and its oldest turns were dropped (the system and
            voice blocks kept); a single turn that fills it ends with "interrupted": true,
            "context_full": true, then an error event
  client → {"type": "turn", "user_text": T}              next turn, the model's cache kept (or
                                                         first: the user's words); sent while a
                                                         turn speaks it cuts that turn short
                                                         (barge-in: "interrupted": true)
  server → {"type": "error", "message": M}               then the server closes the socket
                                                         (1008, M as the close reason); also
                                                         after --live-idle s without a message
                                                         while nothing is spoken
The session's work runs on its model's worker, one short job at a time (a slice of text, one
chunk of the drain), held in the line by a Lane (with serve --max-streams > 1 it also holds one
of the stream places: worker.py); leaving closes the session and frees the slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import BackendLost, ContextFull, MossTTSError
from ..knobs import SPELLINGS
from ..live import as_frames, push_as_typed
from .formats import pcm_bytes
from .request import MAX_INPUT_CHARS, RequestError, knob_fields, parse_object, string_field
from .responses import first_line
from .warned import serving

logger = logging.getLogger(__name__)

LIVE_FIELDS = ("model", "voice", "reference_audio", "format", *SPELLINGS)   # knobs.KNOBS
MESSAGE_FIELDS = ("type", "text", "user_text")
SLICE_CHARS = 32     # text handed to one worker job: a leaving client waits at most one slice
CLOSE_ERROR, CLOSE_INTERNAL = 1008, 1011      # WebSocket close codes: policy, server failure
CLOSE_RETRY = 1013     # ... try again later: the model's backend is lost (hosted.py)


@dataclass(frozen=True)
class LiveConfig:
    """The first message, in the fields ServedModel.stream_keywords and the voice lookup read."""

    model: str | None
    voice: str | None
    reference_audio: str | None
    knobs: dict               # knob name → value (a live turn's max_frames caps each turn)
    given_as: dict            # knob name → the field that gave it


def parse_config(raw: str) -> LiveConfig:
    body = parse_object(raw.encode(), (*LIVE_FIELDS, *MESSAGE_FIELDS))
    if set(body) - set(LIVE_FIELDS):   # a message sent before the config
        raise RequestError(400, f"the first message is the config ({', '.join(LIVE_FIELDS)}; "
                                "all optional: {} for the defaults); text, end and turn "
                                "messages come after it")
    string_field(body, "format", None, ("pcm",))
    return LiveConfig(model=string_field(body, "model"), voice=string_field(body, "voice"),
                      reference_audio=string_field(body, "reference_audio"), **knob_fields(body))


def parse_message(raw: str) -> tuple[str, str | None]:
    """A client message after the config → (kind, its text): ("text", delta), ("end", None),
    ("turn", user text or None)."""
    body = parse_object(raw.encode(), MESSAGE_FIELDS)
    kind = string_field(body, "type", None, ("text", "end", "turn"))
    if kind is None:
        raise RequestError(400, "a message needs 'type': text, end or turn")
    field = {"text": "text", "turn": "user_text"}.get(kind)
    extra = sorted(set(body) - {"type", field})
    if extra:
        raise RequestError(400, f"{kind!r} messages carry no {extra[0]!r}")
    text = string_field(body, field) if field else None
    if kind == "text" and not text:
        raise RequestError(400, "a 'text' message needs a non-empty 'text'")
    if text is not None and len(text) > MAX_INPUT_CHARS:
        raise RequestError(413, f"a message's text is longer than {MAX_INPUT_CHARS} characters")
    return kind, text


def text_slices(text: str) -> list[str]:
    """A delta in SLICE_CHARS pieces, one worker job each (pushed as typed: any split speaks
    the same); the pieces only bound how long one job runs."""
    return [text[i:i + SLICE_CHARS] for i in range(0, len(text), SLICE_CHARS)]


class LiveConnection:
    """One client's session, driven from the event loop: each step is a job on the model's
    worker through the connection's lane, awaited before the next."""

    def __init__(self, lane, channels: int, name: str = "a live session"):
        self.lane, self.channels, self.session, self.drain = lane, channels, None, None
        self.name = name      # how the log names it: what its jobs warn is logged as its

    async def run(self, job):
        def logged(model):
            with serving(self.name):
                return job(model)
        return await asyncio.wrap_future(self.lane.submit(logged))

    async def open(self, make_session) -> None:
        self.session = await self.run(make_session)

    async def push(self, text: str) -> list[np.ndarray]:
        """The audio chunks `text` made ready."""
        return await self.run(lambda model: list(push_as_typed(self.session, text)))

    async def end(self) -> None:
        def end_text(model):
            self.session.end_text()
            self.drain = self.session.drain()
        await self.run(end_text)

    async def next_chunk(self) -> np.ndarray | None:
        """The drain's next chunk, None once the turn's audio is done."""
        return await self.run(lambda model: next(self.drain, None))

    async def new_turn(self, user_text: str | None) -> int:
        """Starts the next turn → how many old turns it dropped to make room."""
        def job(model):
            before = self.session.turns_dropped
            self.session.new_turn(user_text)
            return self.session.turns_dropped - before
        return await self.run(job)

    async def rows(self) -> tuple[int, int]:
        """(backbone rows the conversation holds, the most it may hold)."""
        return await self.run(lambda model: self.session.rows)

    def close(self) -> None:
        """Close the session on the worker (its job needs no room in the line) and free the
        slot; safe to call from a cancelled handler."""
        session = self.session
        if session is not None:
            self.lane.submit(lambda model: session.close())
        self.lane.release()

    def pcm(self, audio) -> bytes:
        return pcm_bytes(as_frames(audio, self.channels))


async def live_endpoint(websocket) -> None:
    """The WebSocket handler, over the app's served models (the model and the voice are picked
    as for /v1/audio/speech)."""
    from starlette.websockets import WebSocketDisconnect

    served = websocket.app.state.served
    await websocket.accept()
    connection = None
    try:
        raw = await next_text(websocket, served.settings.live_idle)
        if raw is None:
            raise idle_error(served.settings.live_idle)
        config = parse_config(raw)
        model = served.pick(config.model)
        if not model.live:
            raise RequestError(400, f"model {model.name!r} has no live mode; pick a "
                                    f"MOSS-TTS-Realtime model: "
                                    f"{', '.join(served.live_names()) or 'none is served'}")
        words = model.stream_keywords(config) | served.live_rows()
        model.check_available()
        lane = model.worker.open_lane()
        if lane is None:
            raise RequestError(503, "busy: too many requests are waiting; retry shortly")
        client = websocket.client
        connection = LiveConnection(lane, model.channels, f"live session for "
                                    f"{client.host}:{client.port} (model {model.name})"
                                    if client else f"a live session (model {model.name})")
        try:
            await connection.open(lambda m: m.session(voice=served.reference_for(m, config),
                                                      **words))
        except ContextFull as e:       # the server's setting, not the client's doing
            raise RequestError(400, f"the conversation's context (serve --live-context) cannot "
                                    f"hold its system and voice block: {first_line(e)}") from None
        _, context = await connection.rows()
        await websocket.send_json({"type": "started", "model": model.name,
                                   "sample_rate": model.sample_rate, "channels": model.channels,
                                   "format": "pcm_s16le", "context": context})
        await converse(websocket, connection, model.sample_rate, served.settings.live_idle,
                       connection.session.max_turn_chars)
    except WebSocketDisconnect:   # it left, or the write deadline cut it (connections.py)
        logger.info("live client left; its session was closed")
    except Exception as e:  # told to the client, then the socket closes
        await send_error(websocket, e)
    finally:
        if connection is not None:
            connection.close()


async def send_error(websocket, e: Exception) -> None:
    if not isinstance(e, MossTTSError):
        logger.error("live session failed", exc_info=e)
    message = first_line(e) if isinstance(e, MossTTSError) else \
        f"internal error: {first_line(e)}"
    try:
        await websocket.send_json({"type": "error", "message": message})
        code = CLOSE_RETRY if isinstance(e, BackendLost) else \
            CLOSE_ERROR if isinstance(e, MossTTSError) else CLOSE_INTERNAL
        await websocket.close(code, reason=close_reason(message))
    except Exception:  # the client left meanwhile: nobody to tell  # noqa: BLE001
        pass


def close_reason(message: str) -> str:
    """The message cut to fit a close frame's reason (123 bytes of UTF-8)."""
    data = message.encode()
    return message if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."


async def converse(websocket, connection: LiveConnection, rate: int, idle: float,
                   max_chars: int) -> None:
    """Reads messages while the session speaks them: text waits in `inbox` while a job runs
    (at most `max_chars` characters a turn), and a client that leaves is seen at once (the
    reader ends the speaker)."""
    inbox = Inbox()
    speaker = asyncio.ensure_future(speak(websocket, connection, inbox, rate))
    reader = asyncio.ensure_future(read_messages(websocket, inbox, idle, max_chars))
    try:
        done, _ = await asyncio.wait({speaker, reader}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()   # a failure (or the client leaving) ends the connection
    finally:
        speaker.cancel()
        reader.cancel()
        await asyncio.gather(speaker, reader, return_exceptions=True)


async def next_text(websocket, within: float) -> str | None:
    """The next client message's text, None when none came within `within` s; a binary one
    is refused, a departure raises."""
    from starlette.websockets import WebSocketDisconnect

    try:
        message = await asyncio.wait_for(websocket.receive(), max(0.0, within))
    except asyncio.TimeoutError:
        return None
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    if message.get("text") is None:
        raise RequestError(400, "binary messages are not accepted: send JSON text")
    return message["text"]


def idle_error(idle: float) -> RequestError:
    return RequestError(408, f"idle: no message for {idle:g} s while nothing was spoken "
                             "(serve --live-idle); reconnect to go on")


class Inbox:
    """Client messages waiting for the session. A `turn` is a barge-in: the text and `end` still
    waiting for the turns before it are dropped, and `cutting` tells the speaker to stop.
    `idle_since` is when the speaker began waiting for a message with none left (None while
    it works): the idle limit counts from then, or from the last message if later."""

    def __init__(self):
        self._items: deque = deque()
        self._ready = asyncio.Event()
        self.idle_since: float | None = None

    def put(self, kind: str, text: str | None) -> None:
        if kind == "turn":
            self._items = deque(item for item in self._items if item[0] == "turn")
        self._items.append((kind, text))
        self._ready.set()

    @property
    def cutting(self) -> bool:
        return any(kind == "turn" for kind, _ in self._items)

    async def get(self) -> tuple[str, str | None]:
        while not self._items:
            self._ready.clear()
            self.idle_since = asyncio.get_running_loop().time()
            try:
                await self._ready.wait()
            finally:
                self.idle_since = None
        return self._items.popleft()

    def take_text(self) -> str:
        """All the text that waits next, as one delta."""
        text = ""
        while self._items and self._items[0][0] == "text":
            text += self._items.popleft()[1]
        return text


async def read_messages(websocket, inbox: Inbox, idle: float, max_chars: int) -> None:
    """Checks each message against the turn's state as it arrives: text after `end`, and a
    turn's text past `max_chars` characters (the session's bound: it could never take more),
    are refused before the session sees them, so a client that sends faster than its session
    speaks cannot pile up text in the inbox. A client silent for `idle` s while nothing is
    spoken (its session waits for text) is closed: it would hold its place in the line for
    ever."""
    ended, chars, loop = False, 0, asyncio.get_running_loop()
    last = loop.time()
    while True:
        quiet = loop.time() - max(last, inbox.idle_since or loop.time())   # 0 while speaking
        raw = await next_text(websocket, idle - quiet)
        if raw is None:
            if inbox.idle_since is not None and \
                    loop.time() - max(last, inbox.idle_since) >= idle:
                raise idle_error(idle)
            continue     # it spoke meanwhile, or went idle only lately: wait again
        last = loop.time()
        kind, text = parse_message(raw)
        if kind == "text" and ended:
            raise RequestError(400, "text after 'end': send {\"type\": \"turn\"} to start the "
                                    "next turn first")
        if kind == "end" and ended:
            raise RequestError(400, "'end' twice: the turn has already ended")
        chars = 0 if kind == "turn" else chars + len(text or "")
        if chars > max_chars:
            raise RequestError(413, f"a live turn takes at most {max_chars} characters of text, "
                                    "and this turn's text goes past them: end the turn sooner "
                                    "and send the rest in the next")
        ended = kind == "end"
        inbox.put(kind, text)


async def speak(websocket, connection: LiveConnection, inbox: Inbox, rate: int) -> None:
    """The session's side: text (all that waits, in slices) → audio, end → the drain to EOS
    and `turn_done`, turn → a new turn, cutting short the one still speaking (its `turn_done`
    says `interrupted`). A full context ends the turn speaking with a `turn_done` that says
    so, then the connection."""
    turn = Turn(websocket, connection, rate)
    while True:
        kind, text = await inbox.get()
        turn.speaking = turn.speaking or kind != "turn"
        try:
            await speak_one(turn, inbox, kind, text)
        except ContextFull:
            _, limit = await connection.rows()
            if turn.speaking:
                await turn.done(interrupted=True, context_full=True)
            raise RequestError(413, f"the conversation filled its context of {limit} rows "
                                    "(serve --live-context): open a new connection to go "
                                    "on") from None


async def speak_one(turn: "Turn", inbox: Inbox, kind: str, text: str | None) -> None:
    connection = turn.connection
    if kind == "text":
        for piece in text_slices(text + inbox.take_text()):
            if inbox.cutting:
                break
            for audio in await connection.push(piece):
                await turn.send(audio)
    elif kind == "end":
        await connection.end()
        while not inbox.cutting and (chunk := await connection.next_chunk()) is not None:
            await turn.send(chunk)
        if not inbox.cutting:     # a turn cut at its frame budget says so
            cut = await connection.run(lambda model: connection.session.budget_cut)
            await turn.done(interrupted=False, **({"cut": "max_frames"} if cut else {}))
    else:
        if turn.speaking:
            await turn.done(interrupted=True)
        if dropped := await connection.new_turn(text):
            used, limit = await connection.rows()
            await turn.websocket.send_json({"type": "context_trimmed", "turns_dropped": dropped,
                                            "context_left": limit - used})


class Turn:
    """The turn speaking: the samples sent, whether its text began (no turn_done yet), and
    the conversation's context left, told in each turn_done."""

    def __init__(self, websocket, connection: LiveConnection, rate: int):
        self.websocket, self.connection, self.rate = websocket, connection, rate
        self.sent, self.speaking = 0, False

    async def send(self, audio) -> None:
        """One chunk (nothing when it is empty); a client that stops reading is cut at the
        socket by the write deadline (connections.py), seen here as its departure."""
        data = self.connection.pcm(audio)
        if data:
            await self.websocket.send_bytes(data)
        self.sent += len(data) // 2

    async def done(self, interrupted: bool, **extra) -> None:
        used, limit = await self.connection.rows()
        left = max(0, limit - used)
        await self.websocket.send_json({
            "type": "turn_done", "interrupted": interrupted,
            "seconds": round(self.sent / self.connection.channels / self.rate, 3),
            "context_left": left, **extra})
        self.sent, self.speaking = 0, False
