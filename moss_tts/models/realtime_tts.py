"""`RealtimeTTS`: text → 24 kHz speech with MossTTSRealtime and the MOSS-Audio-Tokenizer codec,
offline (`synthesize`, `stream`; several requests decoded together with `synthesize_many`,
models/realtime_decode.py) and live (`session`, models/realtime_live.py: text deltas in as an
LLM writes them, audio out as it is made, the KV cache kept across the turns of a conversation;
docs/upstream-notes.md §family-5.4-5.6, upstream `streaming_mossttsrealtime.py`).

Audio leaves through the codec's exact streaming decoder: offline as the chunk ladder says
(models/chunk_ladder.py), live the frames each call draws in one push.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..audio import REFERENCE_MAX_SECONDS, resample, to_channels
from ..errors import whole_number
from ..sampling import RealtimeSamplingOptions
from ..text import realtime_prompts as prompts
from .chunk_ladder import WHOLE_PUSHES, ChunkLadder, chunk_frames_of
from .tts import BudgetMeter, FrameBudget, Reference, family_stream
from .qwen3_tts import Qwen3TTS
from .realtime import KIND, MAX_FRAMES, TOKENIZER_KEY, RealtimeModel, decodable
from .realtime_decode import RealtimeBatch
from .realtime_live import SESSION_ROWS, FrameAudio, LiveSession


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
    KEYWORDS = ("max_frames",)
    MODEL, TOKENIZER_KEY = RealtimeModel, TOKENIZER_KEY
    BATCHED = RealtimeBatch    # offline streams only: a live session decodes on its own
    LIVE = True                # `session`
    # frames of one request (of one turn, live): the model card's 32K-token context (~40 min)
    # holds the prompt and the frames; no more can be used
    BUDGET = FrameBudget("max_frames", MAX_FRAMES, 32768, "frames")
    WHOLE = WHOLE_PUSHES          # whole audio: fixed pushes (chunk_ladder.py)

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
               seed: int | None = None, max_frames: int = MAX_FRAMES,
               chunk_frames: int = 0) -> Iterator[np.ndarray]:
        """Offline as upstream's inferencer (the whole text tokenized at once): audio chunks
        [hop, 1], one per frame (several frames pushed at once where the codec decodes one
        slower than real time: chunk_ladder.py; `chunk_frames` N: N a push), until EOS or the
        first frame the codec cannot take. Frames come from this request's own decode, or from
        the batch of a `synthesize_many` (or `decoding_together`) that made this stream."""
        rows, text_ids = self.plan(text, reference=reference)
        frames = BudgetMeter(self._generated(rows, text_ids=text_ids, options=options, seed=seed,
                                             max_frames=max_frames), max_frames)
        codec, ended = self._need_codec(), []
        chunk_frames = chunk_frames_of(chunk_frames)

        def spoken():         # up to the first frame the codec cannot take (P6), which ends it
            for frame in frames:
                if not decodable(frame, self.config.codebook_size):
                    ended.append(frame)
                    return
                yield np.asarray(frame)
        # one frame a push, as upstream's bridge, unless the codec cannot keep up (chunk_ladder.py)
        ladder = ChunkLadder(codec.config.frame_rate, fixed=chunk_frames, first=1, steps=(),
                             longest=1)
        with codec.stream_decoder(n_quantizers=self.config.rvq) as decoder:
            yield from ladder.audio(decoder, spoken())
        if not ended:
            yield from frames.cuts()

    def frame_audio(self) -> FrameAudio:
        """A codec stream taking frames as a live session draws them (`push`, `close`,
        `frame_rate`): each turn of a `session` speaks through a fresh one."""
        return FrameAudio(self._need_codec(), self.config.codebook_size, self.config.rvq)

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

