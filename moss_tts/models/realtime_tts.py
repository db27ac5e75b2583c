"""`RealtimeTTS`: text → 24 kHz speech with MossTTSRealtime and the MOSS-Audio-Tokenizer codec,
offline (`synthesize`, `stream`; several requests decoded together with `synthesize_many`,
models/realtime_decode.py) and live (`session`: text deltas in as an LLM writes them,
audio out as it is made, the KV cache kept across the turns of a conversation;
docs/upstream-notes.md §family-5.4-5.6, upstream `streaming_mossttsrealtime.py`).

Audio leaves through the codec's exact streaming decoder one frame (80 ms) at a time.
"""

from __future__ import annotations

import re
import warnings
from collections import deque
from collections.abc import Iterator

import numpy as np

from ..audio import REFERENCE_MAX_SECONDS, resample, to_channels
from ..codec import Codec
from ..errors import BudgetWarning, InputError, whole_number
from ..ggml.backend import NativeResource, released_on_error
from ..sampling import RealtimeSamplingOptions
from ..text import realtime_prompts as prompts
from ..tts import BudgetMeter, FrameBudget, Reference, check_text, family_stream
from .qwen3_tts import Qwen3TTS
from .realtime import KIND, MAX_FRAMES, TOKENIZER_KEY, RealtimeModel, decodable
from .realtime_decode import RealtimeBatch

# Backbone rows a live session holds (system block, voice, every turn's text and frames):
# ~2.7 min of speech; 230 MB of f16 KV cache at the 1.7B shape
SESSION_ROWS = 2048
# A conversation short of room drops its oldest turns (as a chat server drops old messages,
# the system and voice blocks kept) when a new turn starts with less than TRIM_BELOW of its
# rows left, down to at most TRIM_TO of them used (always keeping the latest turn)
TRIM_BELOW, TRIM_TO = 0.25, 0.5
# Upstream's segmenting of text deltas (streaming_mossttsrealtime.py `_extract_text_segments`,
# §family-5.6): cut after sentence or clause punctuation once the buffer holds MIN_SEGMENT
# characters, else at the last space once it holds MAX_BUFFER (with no space: at MAX_BUFFER)
SEGMENT_END = re.compile(r"[。！？!?.\u2026]\s*|[,，;；:：\u2014\u2013\-]\s*|\)\s*|\]\s*|\n")
SPACE = re.compile(r"\s")          # what a SEGMENT_END match takes after its mark
MIN_SEGMENT, MAX_BUFFER = 8, 32
EMPTY = np.zeros(0, dtype=np.float32)


class TextSegmenter:
    """A turn's text, a character at a time → the segments to tokenize, cut where upstream's
    session cuts its buffer when it is given the text a character at a time, in constant work
    per character (rescanning the buffer after each one cost its length: a text without a cut
    grew quadratic). A buffer with no cut in it gains one only at its end, so the segmenter
    keeps whether a SEGMENT_END match ends there instead of searching: one that does, once
    MIN_SEGMENT characters are buffered, is the first match ending that late (there was no cut
    before) and cuts the whole buffer. The space cut keeps what follows the last space (fewer
    than MAX_BUFFER characters, holding no cut), read once more."""

    def __init__(self):
        self.buffer = ""
        # a SEGMENT_END match ends at the buffer's end: "open" (a mark and the whitespace after
        # it, which more whitespace extends), "closed" (a lone newline), or None
        self._match: str | None = None
        self._space = -1                # where the buffer's last space is

    def push(self, ch: str) -> str | None:
        """One character → the segment it completes, or None."""
        self._take(ch)
        n = len(self.buffer)
        if self._match and n >= MIN_SEGMENT:
            cut = n
        elif n >= MAX_BUFFER:
            # upstream cuts only at a space (58b20a0) and buffers a text without one (CJK with
            # no punctuation, a flood) for ever; its later revision (f12b607) cuts at
            # MAX_BUFFER there, and so do we (docs/upstream-notes.md §family-5.6)
            cut = self._space + 1 if self._space >= 0 else n
        else:
            return None
        segment, rest = self.buffer[:cut], self.buffer[cut:]
        self.buffer, self._match, self._space = "", None, -1
        for c in rest:
            self._take(c)
        return segment

    def flush(self) -> str:
        """What is still buffered (the turn's text is over); the segmenter starts empty."""
        rest = self.buffer
        self.buffer, self._match, self._space = "", None, -1
        return rest

    def _take(self, ch: str) -> None:
        if ch == " ":
            self._space = len(self.buffer)
        self.buffer += ch
        if SEGMENT_END.match(ch):       # a mark opens a match; a newline extends an open one
            self._match = "closed" if ch == "\n" and self._match != "open" else "open"
        elif not (self._match == "open" and SPACE.match(ch)):
            self._match = None


class FrameAudio(NativeResource):
    """Frames in, audio out through one codec stream: a frame is decoded as it comes, and the
    first holding a code the codec cannot take (pad, BOS, EOS) ends this stream's audio — the
    sanitizer of upstream's streaming bridge (P6)."""

    def __init__(self, codec: Codec, codebook_size: int, n_vq: int):
        self.codec, self.codebook_size, self.n_vq = codec, codebook_size, n_vq
        self.decoder = None
        self.ended = False

    def push(self, frame: np.ndarray) -> np.ndarray:
        """One frame [n_vq] → its samples [hop] (none once the audio has ended)."""
        if self.ended or not decodable(frame, self.codebook_size):
            self.ended = True
            return EMPTY
        if self.decoder is None:
            self.decoder = self.codec.stream_decoder(n_quantizers=self.n_vq)
        return self.decoder.push(np.asarray(frame)[:, None]).reshape(-1)

    def close(self) -> None:
        if getattr(self, "decoder", None) is not None:
            self.decoder.close()
            self.decoder = None


class RealtimeTTS(Qwen3TTS):
    """MOSS-TTS-Realtime. `RealtimeTTS.load("realtime.gguf", codec="codec.gguf")`, then
    `synthesize(text)` offline, or `session()` live.

    >>> tts = RealtimeTTS.load("realtime.gguf", codec="codec.gguf")          # doctest: +SKIP
    >>> with tts.session(seed=1) as s:                                       # doctest: +SKIP
    ...     audio = [s.push_text(delta) for delta in ("Hello, ", "how are ", "you?")]
    ...     s.end_text()
    ...     audio += list(s.drain())
    """

    CODEC_NAME = "the MOSS-Audio-Tokenizer (24 kHz) GGUF"
    FAMILY, NAME, OPTIONS = KIND, "MOSS-TTS-Realtime", RealtimeSamplingOptions
    MODEL, TOKENIZER_KEY = RealtimeModel, TOKENIZER_KEY
    BATCHED = RealtimeBatch    # offline streams only: a live session decodes on its own
    LIVE = True                # `session`
    # frames of one request (of one turn, live): the model card's 32K-token context (~40 min)
    # holds the prompt and the frames; no more can be used
    BUDGET = FrameBudget("max_frames", MAX_FRAMES, 32768, "frames")

    @staticmethod
    def prompt_ids(c) -> prompts.RealtimePromptIds:
        return prompts.RealtimePromptIds(
            c.rvq, c.im_start_token_id, c.im_end_token_id, c.reference_audio_pad, c.text_pad,
            c.audio_pad_token, c.audio_bos, c.audio_eos, c.delay_tokens_len)

    def encode_reference(self, samples, sample_rate: int, *,
                         max_seconds: float | None = REFERENCE_MAX_SECONDS) -> Reference:
        """Reference speech → codes [frames, rvq]: mono mix, the codec's rate, the codec (no
        loudness normalization for this family, §family-1.3)."""
        codec = self._need_codec()
        x, sample_rate = self._reference_audio(samples, sample_rate, max_seconds)
        x = resample(to_channels(x, 1), sample_rate, codec.sample_rate)
        return self._encoded(codec.encode(x, codec.sample_rate, n_quantizers=self.config.rvq))

    def plan(self, text: str, *, reference: Reference | None = None):
        """(prompt rows [S, 1 + rvq] ending on the lead rows, the text ids fed afterwards)."""
        text = self._texts(text, {})
        reference = self._reference(reference, "reference")
        return prompts.build_generation_rows(self.tokenizer, self.ids, text,
                                             voice=None if reference is None else reference.codes)

    def forward(self, rows) -> np.ndarray:
        """rows [S, 1 + rvq] → backbone hidden states [S, H] (research API)."""
        self._need_open()
        return self.model.forward(rows)

    def local_logits(self, hidden_row, codes) -> np.ndarray:
        """hidden [H], a frame's codes [rvq] → teacher-forced logits [rvq, audio_vocab_size]."""
        self._need_open()
        return self.model.local_logits(hidden_row, codes)

    def generate(self, rows, text_ids=(), **kwargs) -> np.ndarray:
        """Prompt rows and the text ids to come → frames [N, rvq] (options, seed, max_frames)."""
        self._need_open()
        return self.model.generate(rows, text_ids, **self._checked(kwargs, "max_frames"))

    @family_stream
    def stream(self, text: str, *, reference: Reference | None = None,
               options: RealtimeSamplingOptions = RealtimeSamplingOptions(),
               seed: int | None = None, max_frames: int = MAX_FRAMES) -> Iterator[np.ndarray]:
        """Offline as upstream's inferencer (the whole text tokenized at once): audio chunks
        [hop, 1], one per frame, until EOS or the first frame the codec cannot take. Frames
        come from this request's own decode, or from the batch of a `synthesize_many` (or
        `decoding_together`) that made this stream."""
        rows, text_ids = self.plan(text, reference=reference)
        frames = BudgetMeter(self._generated(rows, text_ids=text_ids, options=options, seed=seed,
                                             max_frames=max_frames), max_frames)
        with self._frame_audio() as audio:
            for frame in frames:
                chunk = audio.push(frame)
                if audio.ended:
                    return
                yield chunk[:, None]
        yield from frames.cuts()

    def session(self, voice: Reference | None = None,
                options: RealtimeSamplingOptions | None = None, seed: int | None = None, *,
                max_frames: int = MAX_FRAMES, max_rows: int = SESSION_ROWS) -> "LiveSession":
        """A live conversation: `push_text` deltas, `end_text`, `drain`, `new_turn`, `close`.
        max_frames caps each turn; max_rows the whole conversation's backbone rows (both checked
        against the budget's limit before the session's cache is reserved)."""
        self._need_codec()
        max_frames = self.BUDGET.check(max_frames)
        max_rows = whole_number(max_rows, "max_rows", 1, self.BUDGET.limit)
        return LiveSession(self, self._reference(voice, "voice"),
                           options or RealtimeSamplingOptions(), seed, max_frames=max_frames,
                           max_rows=max_rows)

    def _frame_audio(self) -> FrameAudio:
        return FrameAudio(self._need_codec(), self.config.codebook_size, self.config.rvq)


class LiveSession(NativeResource):
    """One conversation with MossTTSRealtime, text arriving as it is written (upstream
    `MossTTSRealtimeStreamingSession`). Frames are paced by the text: the 12th token (the end
    of the lead) draws the first frame, each later token exactly one more. `push_text`
    returns the audio ready now and never waits for text to come. Deltas are cut into
    segments at punctuation or spaces (as upstream) and each segment is tokenized on its own.
    A turn takes at most `max_turn_tokens` text tokens (the context's rows: see __init__);
    text past them is refused with an InputError.

    The backbone keeps up with the text: the system block runs when the session opens, a
    turn's prompt rows with its first token, and each lead token as soon as the next one
    shows it is not the last (the last lead row carries BOS) — so the 12th token costs one
    backbone step and one frame. The lead is always min(12, the turn's tokens), the training
    layout, also when `end_text` finds more than 12 tokens waiting (upstream's session would
    put them all before BOS). One caller at a time (a session is not thread-safe).
    """

    def __init__(self, tts: RealtimeTTS, voice: Reference | None,
                 options: RealtimeSamplingOptions, seed: int | None, *, max_frames: int,
                 max_rows: int):
        self._closed = True
        if max_frames < 1 or max_rows < 1:
            raise InputError(f"max_frames and max_rows must be at least 1, got {max_frames}, "
                             f"{max_rows}")
        self.tts, self.ids, self.max_frames = tts, tts.ids, max_frames
        voice_codes = None if voice is None else voice.codes
        system = prompts.system_rows(tts.tokenizer, self.ids, voice_codes)
        self._stream = tts.model.stream(max_rows, options=options, seed=seed)
        # A turn's text is bounded by what the turn could ever speak: every text token it
        # speaks takes one row of the conversation's context (the lead's rows, then one per
        # frame), so past the context's rows nothing more can be spoken whatever max_frames
        # says. max_frames stays a cap, as offline: text past it is dropped with the
        # BudgetWarning. Each segment (at most MAX_BUFFER characters) gives at least one token
        # (a byte-level BPE gives every non-empty text one), so the characters are bounded too.
        self.max_turn_tokens = self._stream.backbone.capacity     # max_rows, aligned: `rows`
        self.max_turn_chars = MAX_BUFFER * self.max_turn_tokens
        with released_on_error(self._stream):
            self._stream.feed(system)
            self._audio = tts._frame_audio()
        self._closed = False
        # rows of the system (and voice) block; the row where each opened turn's
        # `<|im_start|>` is: a trim keeps the block and the turns from one such row on (P17)
        self._system_rows, self._turn_starts = len(system), []
        self.turns_dropped = 0           # the oldest turns trimmed away so far
        self._first = True               # no turn has opened yet: the next opens without <|im_end|>
        self._start_turn(None, None)

    # -- the API ----------------------------------------------------------------------------
    def push_text(self, delta: str) -> np.ndarray:
        """A text delta → the float32 audio [n] ready now (often empty). The text is cut a
        character at a time, so the speech does not depend on how it was split into deltas
        (a cut checked only at a delta's end would move with it: "there, this" in one delta
        cuts after the space, in two it cuts before)."""
        self._need_text()
        if not isinstance(delta, str):
            raise InputError(f"push_text takes text (str), got {type(delta).__name__}")
        for ch in check_text(delta, "push_text's text"):
            if (segment := self._segments.push(ch)) is not None:
                self._queue(self.tts.tokenizer.encode(segment))
        return _joined(self._advance())

    def push_tokens(self, ids) -> np.ndarray:
        """Text ids of this model's tokenizer (for sources that stream ids) → the audio ready
        now, as `push_text` (and within the same bound)."""
        self._need_text()
        ids = [int(i) for i in ids]
        if any(not 0 <= i < self.tts.config.vocab_size or i in self.tts.tokenizer.control
               for i in ids):
            raise InputError(f"push_tokens takes ordinary text ids below "
                             f"{self.tts.config.vocab_size}, no control ids")
        self._queue(ids)
        return _joined(self._advance())

    def end_text(self) -> None:
        """No more text this turn; its last buffered segment is tokenized now."""
        self._need_open()
        if not self._ended:
            if rest := self._segments.flush():
                self._queue(self.tts.tokenizer.encode(rest))
            self._ended = True

    def drain(self) -> Iterator[np.ndarray]:
        """The rest of the turn's audio, a chunk per frame, until EOS (or max_frames): the
        waiting text first, then `<|text_pad|>` rows. Ends the text if that was not done."""
        self._need_open()
        self.end_text()
        return self._drain()

    def new_turn(self, user_text: str | None = None, user_audio: Reference | None = None) -> None:
        """Start the next assistant turn, keeping the KV cache: the finished turn's EOS row
        (training layout), then a user turn when user text or audio (codes from
        `tts.encode_reference`) is given. A turn still speaking is cut where it is (barge-in)."""
        self._need_open()
        if user_text is not None:
            check_text(user_text, "user_text")
        user_audio = self.tts._reference(user_audio, "user_audio")
        if self._opened:     # the EOS row only closes a turn that spoke until EOS
            head = prompts.eos_row(self.ids) if self._prefilled and self._stream.finished \
                else None
        else:   # nothing of this turn ran: its rows go, what came before it stays
            head = self._head
        user = None
        if user_text is not None or user_audio is not None:
            user = prompts.user_turn_rows(
                self.tts.tokenizer, self.ids, user_text or "",
                None if user_audio is None else user_audio.codes, first=self._first)
        self._trim()
        self._start_turn(head, user)

    @property
    def frames(self) -> np.ndarray:
        """This turn's frames so far [N, rvq] as drawn (EOS frame included, unsanitized)."""
        frames = self._stream.frames if self._prefilled else []
        return np.array(frames, dtype=np.int64).reshape(-1, self.ids.rvq)

    @property
    def text_ids(self) -> list[int]:
        """This turn's text ids the backbone has taken (what the frames are paced by)."""
        return list(self._text_ids)

    @property
    def rows(self) -> tuple[int, int]:
        """(backbone rows the conversation holds, the most it may hold: max_rows rounded up
        to the cache's slot alignment)."""
        return self._stream.position, self._stream.backbone.capacity

    @property
    def cache_rows(self) -> np.ndarray:
        """The rows the conversation's cache holds [rows, 1 + rvq]: the system (and voice)
        block, then the turns not trimmed away."""
        return self._stream.rows

    @property
    def budget_cut(self) -> bool:
        """True once this turn's audio ended at max_frames, not at the model's end of speech
        (the drain's BudgetWarning, for a caller on another thread than warnings reach)."""
        return self._prefilled and self._frames >= self.max_frames and \
            not self._stream.finished

    @property
    def closed(self) -> bool:
        """True once `close` ran (by the owner, or the server when its client left)."""
        return getattr(self, "_closed", True)

    def close(self) -> None:
        if self.closed:
            return
        self._closed = True
        self._audio.close()
        self._stream.close()

    # -- the turn ---------------------------------------------------------------------------
    def _start_turn(self, head: np.ndarray | None, user: np.ndarray | None) -> None:
        self._head = head
        # the prompt's rows before its `<|im_start|>`: the EOS row and `<|im_end|>\n` that
        # close the turn before it belong to that turn
        closing = 0 if self._first else 1 + len(self.tts.tokenizer.encode("\n"))
        self._opening = (0 if head is None else len(head)) + closing
        parts = [p for p in (head, user) if p is not None]
        parts.append(prompts.assistant_prefix_rows(self.tts.tokenizer, self.ids,
                                                   first=self._first and user is None))
        self._prompt = np.vstack(parts)
        # the lead's rows and the first frame run while the text arrives: their graphs now
        self._stream.warm(len(self._prompt) + self.ids.lead)
        self._segments, self._pending, self._text_ids = TextSegmenter(), deque(), []
        self._opened = self._prefilled = self._ended = False
        self._frames = 0
        self._audio.close()
        self._audio = self.tts._frame_audio()

    def _advance(self) -> Iterator[np.ndarray]:
        """Take the waiting tokens: the turn's prompt with the first, lead rows while the lead
        is not complete, its BOS row (the first frame), then a frame per token: each frame's
        audio."""
        if not self._pending:
            return
        if not self._opened:     # text arrived: the turn is on, its prompt rows go in now
            self._turn_starts.append(self._stream.position + self._opening)
            self._stream.feed(self._prompt)
            self._opened, self._first = True, False
        if not self._prefilled:
            last_lead = self.ids.lead - 1
            while len(self._pending) > 1 and len(self._text_ids) < last_lead:
                self._stream.feed(prompts.text_rows([self._take()], self.ids))
            if len(self._text_ids) == last_lead or self._ended:
                self._prefilled = True
                yield self._frame(self._stream.start(prompts.lead_rows([self._take()], self.ids)))
        while self._prefilled and self._pending and not self._done:
            yield self._frame(self._stream.step(self._take()))

    def _trim(self) -> None:
        """Drop the oldest turns when less than TRIM_BELOW of the rows is left, keeping the
        system and voice blocks and the newest turns that fit in TRIM_TO (at least the
        latest): the cache is refed with those rows, exactly as a conversation that began
        with the first turn kept (its `<|im_start|>` follows the block, the first-turn
        layout, P17)."""
        used, capacity = self.rows
        starts = self._turn_starts
        if capacity - used >= capacity * TRIM_BELOW or len(starts) < 2:
            return
        keep = next((j for j in range(1, len(starts))
                     if self._system_rows + used - starts[j] <= capacity * TRIM_TO),
                    len(starts) - 1)
        rows = self.cache_rows
        self._stream.refeed(np.vstack([rows[:self._system_rows], rows[starts[keep]:]]))
        shift = starts[keep] - self._system_rows
        self._turn_starts = [start - shift for start in starts[keep:]]
        self.turns_dropped += keep

    def _queue(self, ids) -> None:
        """Text ids for the turn, or one InputError once its text would pass its bound (the
        text before stays in the turn: `end_text` and `drain` speak it)."""
        if len(self._text_ids) + len(self._pending) + len(ids) > self.max_turn_tokens:
            raise InputError(
                f"a live turn takes at most {self.max_turn_tokens} text tokens, the rows of its "
                "conversation's context (each token it speaks takes one), and this turn's text "
                "goes past them: end the turn sooner and send the rest in the next")
        self._pending += ids

    def _take(self) -> int:
        token = self._pending.popleft()
        self._text_ids.append(token)
        return token

    def _drain(self) -> Iterator[np.ndarray]:
        for chunk in self._advance():
            if chunk.size:
                yield chunk
        while self._prefilled and not self._done:
            chunk = self._frame(self._stream.step(self.ids.text_pad))
            if chunk.size:
                yield chunk
        if self._prefilled and not self._stream.finished:   # one warning per turn, as offline
            warnings.warn(BudgetWarning(
                f"this turn used its whole frame budget ({self.max_frames} frames) before the "
                "model ended it: the audio is cut — raise max_frames", "max_frames"),
                stacklevel=2)

    @property
    def _done(self) -> bool:
        return self._stream.finished or self._frames >= self.max_frames

    def _frame(self, frame: np.ndarray) -> np.ndarray:
        self._frames += 1
        return self._audio.push(frame)

    def _need_open(self) -> None:
        if self._closed:
            raise InputError("session is closed; open a new one with tts.session()")

    def _need_text(self) -> None:
        self._need_open()
        if self._ended:
            raise InputError("push_text after end_text(): this turn's text is over — start the "
                             "next turn with new_turn()")


def _joined(chunks) -> np.ndarray:
    parts = [c for c in chunks if c.size]
    return np.concatenate(parts) if parts else EMPTY
