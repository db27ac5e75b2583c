"""`LiveSession`: one live conversation with MossTTSRealtime (`RealtimeTTS.session`, models/
realtime_tts.py): text deltas in as an LLM writes them, cut into segments as upstream cuts them
(`TextSegmenter`), audio out as its frames are drawn (`FrameAudio`), the KV cache kept across
the turns (docs/upstream-notes.md §family-5.4-5.6, upstream `streaming_mossttsrealtime.py`).
"""

from __future__ import annotations

import re
import warnings
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BudgetWarning, InputError
from ..ggml.backend import NativeResource, released_on_error
from ..text import realtime_prompts as prompts
from .chunk_ladder import ChunkLadder
from .realtime import decodable
from .tts import Reference, check_text

if TYPE_CHECKING:
    from ..codec import Codec
    from ..sampling import RealtimeSamplingOptions
    from .realtime_tts import RealtimeTTS

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


class FrameAudio(NativeResource):
    """Frames in, audio out through one codec stream; the first frame holding a code the codec
    cannot take (pad, BOS, EOS) ends this stream's audio — the sanitizer of upstream's
    streaming bridge (P6). The frames one call draws go to the codec in one push: a push
    reads every decoder weight however few its frames (docs/performance.md, "Streaming
    through the codecs"), and the samples are the same however frames are grouped."""

    def __init__(self, codec: Codec, codebook_size: int, n_vq: int):
        self.codec, self.codebook_size, self.n_vq = codec, codebook_size, n_vq
        self.frame_rate = codec.config.frame_rate      # frames a second (the chunk ladder's)
        self.decoder = None
        self.ended = False

    def push(self, codes) -> np.ndarray:
        """Codes [n_vq, n] (n frames, as a codec stream decoder takes them; or one frame
        [n_vq]) → their samples [n·hop], up to the first frame the codec cannot take (none
        once the audio has ended)."""
        frames = np.asarray(codes).reshape(self.n_vq, -1).T
        if self.ended or not len(frames):
            return EMPTY
        ok = decodable(frames, self.codebook_size)
        if not ok.all():
            self.ended = True
            frames = frames[:int(np.argmin(ok))]
            if not len(frames):
                return EMPTY
        if self.decoder is None:
            self.decoder = self.codec.stream_decoder(n_quantizers=self.n_vq)
        return self.decoder.push(frames.T).reshape(-1)

    def close(self) -> None:
        if getattr(self, "decoder", None) is not None:
            self.decoder.close()
            self.decoder = None


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
            self._audio = tts.frame_audio()
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
        return self._audio.push(_codes(self._advance(), self.tts.config.rvq))

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
        return self._audio.push(_codes(self._advance(), self.tts.config.rvq))

    def end_text(self) -> None:
        """No more text this turn; its last buffered segment is tokenized now."""
        self._need_open()
        if not self._ended:
            if rest := self._segments.flush():
                self._queue(self.tts.tokenizer.encode(rest))
            self._ended = True

    def drain(self) -> Iterator[np.ndarray]:
        """The rest of the turn's audio until EOS (or max_frames), a chunk per frame (several
        frames a chunk while the codec cannot keep up: chunk_ladder.py): the waiting text
        first, then `<|text_pad|>` rows. Ends the text if that was not done."""
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
        self._audio = self.tts.frame_audio()

    def _advance(self) -> Iterator[np.ndarray]:
        """Take the waiting tokens: the turn's prompt with the first, lead rows while the lead
        is not complete, its BOS row (the first frame), then a frame per token: the frames."""
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
        # one frame a push, as upstream's bridge, unless the codec cannot keep up: then the
        # frames that pile up go in one push (chunk_ladder.py), as an offline stream's do
        ladder = ChunkLadder(self._audio.frame_rate, first=1, steps=(), longest=1)
        for chunk in ladder.audio(self._audio, self._drained()):
            if chunk.size:
                yield chunk
        if self._prefilled and not self._stream.finished:   # one warning per turn, as offline
            warnings.warn(BudgetWarning(
                f"this turn used its whole frame budget ({self.max_frames} frames) before the "
                "model ended it: the audio is cut — raise max_frames", "max_frames"),
                stacklevel=2)

    def _drained(self) -> Iterator[np.ndarray]:
        """The rest of the turn's frames: the waiting text's, then `<|text_pad|>` rows'."""
        yield from self._advance()
        while self._prefilled and not self._done:
            yield self._frame(self._stream.step(self.ids.text_pad))

    @property
    def _done(self) -> bool:
        return self._stream.finished or self._frames >= self.max_frames

    def _frame(self, frame: np.ndarray) -> np.ndarray:
        self._frames += 1
        return frame

    def _need_open(self) -> None:
        if self._closed:
            raise InputError("session is closed; open a new one with tts.session()")

    def _need_text(self) -> None:
        self._need_open()
        if self._ended:
            raise InputError("push_text after end_text(): this turn's text is over — start the "
                             "next turn with new_turn()")


def _codes(frames, n_vq: int) -> np.ndarray:
    """Frames (each [n_vq]) → codes [n_vq, n], as a codec stream takes them."""
    return np.array(list(frames), dtype=np.int64).reshape(-1, n_vq).T
