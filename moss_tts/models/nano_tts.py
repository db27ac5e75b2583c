"""`NanoTTS`: text → 48 kHz stereo speech with MOSS-TTS-Nano and its codec (docs/upstream-notes.md
§nano-4-9).

Text is normalized and cut into chunks by upstream's rules, in every mode; each chunk is its own
utterance: a prompt, frames until the model stops or the frame budget ends, codec decode, and the
upstream pause after it. `stream()` yields audio as frames are generated, through the codec's
exact streaming decoder, so streamed audio equals `synthesize()` for the same seed.
`synthesize_many()` decodes several requests together, one row per stream in each step
(models/nano_decode.py), each request's audio equal to its `synthesize()`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np

from ..audio import REFERENCE_MAX_SECONDS
from ..codec import Codec, StreamSlot
from ..errors import InputError, ModelFileError, whole_number
from ..ggml import Weights, get_backend
from ..sampling import SamplingOptions
from ..text import (NanoPromptIds, SentencePieceTokenizer, build_rows, pause_samples,
                    prepare_texts, split_into_chunks)
from ..text.chunking import continuation_prompt_text
from ..text.prompts import check_mode
from .tts import BudgetCut, CodecTTS, FrameBudget, Reference, check_text, family_stream
from .nano import KIND, TOKENIZER_KEY, NanoModel
from .batching import STATE_ROWS_STEP
from .nano_decode import FrameSampler, NanoBatch

MAX_FRAMES = 1000          # hard cap per chunk (80 s); upstream's fixed 375 cuts long endings
FRAMES_PER_TOKEN = 6.0     # generous: speech runs ~2-4 frames (80 ms) per text token
MIN_FRAMES = 64
# A chunk's text must fit its frame budget (1000 frames hold ~250-500 tokens of speech); the cap
# also bounds every prompt, so memory does not grow with the length of the text.
MAX_TEXT_TOKENS = 250


# what the budget warning says set a chunk's budget when its text, not max_frames, did
TEXT_BUDGET = (f"its text's length ({FRAMES_PER_TOKEN:g} frames per text token + 50, at least "
               f"{MIN_FRAMES})")


def frame_budget(n_text_tokens: int, cap: float = MAX_FRAMES) -> int:
    """Frames a chunk may use: scales with its text, never above `cap`."""
    return int(min(cap, max(MIN_FRAMES, math.ceil(FRAMES_PER_TOKEN * n_text_tokens) + 50)))


# max_frames caps each chunk's budget, which its text already bounds: the longest chunk
# (MAX_TEXT_TOKENS) may use 1550 frames (124 s), so a larger max_frames could never be used
# and would only size generation states for nothing
BUDGET = FrameBudget("max_frames", MAX_FRAMES, frame_budget(MAX_TEXT_TOKENS, math.inf),
                     "frames", per_chunk=True)


class NanoTTS(CodecTTS):
    """MOSS-TTS-Nano. `NanoTTS.load("nano.gguf", codec="codec-nano.gguf")`, then
    `synthesize(text, reference=(samples, sr))` → (samples float32 [n, 2], 48000). `reference=`
    takes a Reference, its codes [frames, n_vq], or (samples, sample_rate), which are encoded.

    >>> tts = NanoTTS.load("nano.gguf", codec="nano-codec.gguf")          # doctest: +SKIP
    >>> audio, sr = tts.synthesize("Hello there.", seed=1)                  # doctest: +SKIP
    """

    CODEC_NAME = "the MOSS-Audio-Tokenizer-Nano GGUF"
    FAMILY, NAME, OPTIONS = KIND, "MOSS-TTS-Nano", SamplingOptions
    KEYWORDS = ("max_frames", "max_text_tokens", "prompt_text")
    TEXT_FIELDS, BUDGET = (), BUDGET
    MAX_TEXT_TOKENS = MAX_TEXT_TOKENS     # the most `max_text_tokens` takes (knobs.py reads it)
    CHANNELS = 2
    BATCHED = NanoBatch
    _idle_state = None  # the last utterance's generation state, kept for the next

    def __init__(self, model: NanoModel, codec: Codec | None):
        self.model = model
        self.config = model.config
        self.codec = codec
        blob = model.weights.file.get(TOKENIZER_KEY)
        if blob is None:
            raise ModelFileError(f"{model.weights.file.path}: no embedded SentencePiece model "
                                 f"({TOKENIZER_KEY}) — re-convert with `moss_tts convert nano`")
        self.tokenizer = SentencePieceTokenizer.from_bytes(blob, source=str(model.weights.file.path))
        c = self.config
        self.ids = NanoPromptIds(c.im_start_token_id, c.im_end_token_id, c.audio_start_token_id,
                                 c.audio_end_token_id, c.audio_user_slot_token_id,
                                 c.audio_assistant_slot_token_id, c.audio_pad_token_id, c.n_vq)
        if codec is not None:
            self._check_codec(codec)

    @classmethod
    def load(cls, model, *, codec=None, backend=None, threads: int | None = None) -> "NanoTTS":
        b = get_backend(backend, threads)
        return cls._with_codec(NanoModel(Weights.load(model, b)), codec, b)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate        # Nano's config names it so

    # -- references ---------------------------------------------------------------------------
    def encode_reference(self, samples, sample_rate: int, *,
                         max_seconds: float | None = REFERENCE_MAX_SECONDS) -> Reference:
        """Reference speech → its first n_vq codebooks, [frames, n_vq] (mono is duplicated).
        Audio past max_seconds is cut with a warning (None keeps it all: a continuation prompt
        must match its text)."""
        x, sample_rate = self._reference_audio(samples, sample_rate, max_seconds)
        return self._encoded(self._need_codec().encode(x, sample_rate,
                                                       n_quantizers=self.config.n_vq))

    # -- generation -----------------------------------------------------------------------------
    def iter_frames(self, rows: np.ndarray, *, options: SamplingOptions = SamplingOptions(),
                    seed: int | None = None, max_frames: int = MAX_FRAMES) -> Iterator[np.ndarray]:
        """Frames [n_vq] generated after prompt rows, until the model stops (docs/upstream-notes.md
        §nano-4.1)."""
        self._need_open()
        return self._alone(rows, **self._checked(
            {"options": options, "seed": seed, "max_frames": max_frames}, "max_frames"))

    def _alone(self, rows, *, options, seed, max_frames) -> Iterator[np.ndarray]:
        """`iter_frames` on checked keywords, in the generation state kept between utterances."""
        m = self.model
        sampler = FrameSampler(self.config, options, seed, max_frames)
        state = self._take_state(len(rows) + max_frames)
        try:
            h = m.prefill(state, rows)
            while True:
                codes = m.frame(state, h, sampler.choose_code, sampler.decide)
                if codes is None:
                    return
                yield codes
                if not sampler.accept(codes):
                    sampler.report_end()
                    return
                h = m.prefill(state, m.frame_row(codes))
        finally:
            self._give_back(state)

    def _take_state(self, rows: int):
        """A generation state for `rows` rows: the idle one when it is large enough (reset),
        else a new one. Owned by the caller until `_give_back`."""
        idle = self._idle_state
        if idle is not None and idle.capacity >= rows:
            self._idle_state = None
            idle.reset()
            return idle
        return self.model.make_state(-(-rows // STATE_ROWS_STEP) * STATE_ROWS_STEP)

    def _give_back(self, state) -> None:
        """Keep the larger of the returned and the idle state for the next utterance."""
        if self.model is None:                     # closed while a generator was suspended
            state.close()
            return
        keep, drop = state, self._idle_state
        if drop is not None and drop.capacity > state.capacity:
            keep, drop = drop, state
        self._idle_state = keep
        if drop is not None:
            drop.close()

    def generate(self, rows: np.ndarray, **kwargs) -> np.ndarray:
        """Prompt rows → generated codes [frames, n_vq]."""
        self._need_open()
        frames = list(self.iter_frames(rows, **kwargs))
        return np.array(frames, dtype=np.int32).reshape(len(frames), self.config.n_vq)

    def split_text(self, text: str, *, prompt_text: str | None = None, normalize: bool = True,
                   max_text_tokens: int = 75) -> tuple[list[str], str | None]:
        """(chunks, prompt text): the request's text normalized and cut into utterances of at
        most max_text_tokens tokens (upstream's voice-clone rules, used in every mode here)."""
        self._need_open()
        text = check_text(text)
        if prompt_text is not None:
            prompt_text = check_text(prompt_text, "prompt_text")
        max_text_tokens = whole_number(max_text_tokens, "max_text_tokens", 1, MAX_TEXT_TOKENS)
        if not text.strip():
            raise InputError("text is empty")
        if normalize:
            prepared = prepare_texts(text, prompt_text)
            text, prompt_text = prepared.text, prepared.prompt_text
        return split_into_chunks(text, self.tokenizer, max_text_tokens), prompt_text

    def prompt_rows(self, chunk: str, *, reference: Reference | None = None,
                    prompt_text: str | None = None, prompt: Reference | None = None) -> np.ndarray:
        """One utterance's prompt rows [L, n_vq + 1]: voice clone with a reference, else
        continuation (of the prompt audio and its text, when given)."""
        self._need_open()
        reference = self._reference(reference, "reference")
        prompt = self._reference(prompt, "prompt")
        mode = "voice_clone" if reference is not None else "continuation"
        return build_rows(self.tokenizer, chunk, mode=mode, ids=self.ids,
                          reference_codes=None if reference is None else reference.codes,
                          prompt_text=prompt_text,
                          prompt_codes=None if prompt is None else prompt.codes)

    def plan(self, text: str, *, reference=None, prompt_text: str | None = None, prompt=None,
             normalize: bool = True,
             max_text_tokens: int = 75) -> list[tuple[str, np.ndarray | None]]:
        """The utterances of a request: (chunk text, prompt rows). A continuation chunk after
        the first is prompted by the chunk before it as generated, so its rows are None here."""
        reference = self._reference(reference, "reference")
        prompt = self._reference(prompt, "prompt")
        chunks, prompt_text = self.split_text(text, prompt_text=prompt_text, normalize=normalize,
                                              max_text_tokens=max_text_tokens)
        return [(chunk, self.prompt_rows(chunk, reference=reference, prompt_text=prompt_text,
                                         prompt=prompt) if reference is not None or i == 0 else None)
                for i, chunk in enumerate(chunks)]

    @family_stream
    def stream(self, text: str, *, reference=None, prompt_text: str | None = None, prompt=None,
               options: SamplingOptions = SamplingOptions(), seed: int | None = None,
               max_frames: int = MAX_FRAMES, normalize: bool = True,
               max_text_tokens: int = 75) -> Iterator[np.ndarray]:
        """Audio chunks [m, 2] as frames are generated; the pauses between text chunks too.

        `reference` / `prompt`: a Reference, its codes [frames, n_vq], or (samples, sample_rate).
        Each text chunk is its own utterance with a fresh repetition history (as upstream);
        with a seed, chunk i samples from `seed + i`, so a request is reproducible. Without a
        reference, each chunk continues the one before it (its text and generated codes are the
        next prompt, upstream's continuation), so the voice holds across chunks; with a
        continuation prompt, the codec stream first decodes the prompt (discarded), so the
        output continues it seamlessly. Arguments are checked before the first chunk is made.
        """
        codec = self._need_codec()
        chunks, prompt_text = self.split_text(text, prompt_text=prompt_text, normalize=normalize,
                                              max_text_tokens=max_text_tokens)
        check_mode("voice_clone" if reference is not None else "continuation",
                   has_reference=reference is not None, has_prompt_text=prompt_text is not None,
                   has_prompt_codes=prompt is not None)
        return self._utterances(codec, chunks, reference, prompt_text, prompt, options, seed,
                                max_frames)

    def _utterances(self, codec, chunks, reference, prompt_text, prompt, options, seed,
                    max_frames) -> Iterator[np.ndarray]:
        """Each chunk's audio and the pause after it. Voice-clone chunks are decoded each on
        its own (as upstream); continuation chunks share one codec stream, as each continues
        the one before it."""
        decoder = None
        try:
            for i, chunk in enumerate(chunks):
                if decoder is None or reference is not None:
                    if decoder is not None:
                        decoder.close()
                    decoder = self._codec_stream(codec)
                    if prompt is not None:  # continuation: the codec stream continues the prompt
                        decoder.push(prompt.codes.T)
                rows = self.prompt_rows(chunk, reference=reference, prompt_text=prompt_text,
                                        prompt=prompt)
                budget = frame_budget(len(self.tokenizer.encode(chunk)), max_frames)
                frames = []
                for codes, audio in self._voiced(rows, decoder, options=options,
                                                 max_frames=budget,
                                                 seed=None if seed is None else seed + i):
                    frames.append(codes)
                    yield audio
                if len(frames) == budget:    # by max_frames, or below it by the text
                    yield BudgetCut(budget, len(chunks),
                                    None if budget == max_frames else TEXT_BUDGET)
                if reference is None and frames:
                    prompt_text = continuation_prompt_text(chunk)
                    prompt = Reference(np.array(frames, dtype=np.int32))
                if i + 1 < len(chunks) and frames:   # a pause after silence is not speech
                    yield np.zeros((pause_samples(chunk, self.sample_rate), self.channels),
                                   dtype=np.float32)
        finally:
            if decoder is not None:
                decoder.close()

    def _codec_stream(self, codec):
        """A new codec stream for an utterance: inside `decoding_together`, a slot of the
        batch's codec streams while one is free (its frames are decoded with the others',
        one codec push per step), else a StreamDecoder of its own."""
        streams = None if self._batch is None else self._batch.family.codec_streams
        stream = None if streams is None else streams.stream()
        return stream or codec.stream_decoder(n_quantizers=self.config.n_vq)

    def _voiced(self, rows, decoder, **keywords) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Each frame made after prompt rows (`_generated`'s keywords), with its audio: a slot
        of the batch's codec streams has it decoded by the batch's step, any other decoder
        is pushed the frame here. The same audio either way (codec/stream_batch.py)."""
        if not isinstance(decoder, StreamSlot):
            for codes in self._generated(rows, **keywords):
                yield codes, decoder.push(codes[:, None])
            return
        job = self._batch.family.job(rows, codec_slot=decoder.slot, **keywords)
        # closed before the slot is released (the caller's finally): a job still in the
        # batch would be decoded through a released slot
        with contextlib.closing(self._batch.items(job)) as frames:
            for i, codes in enumerate(frames):
                yield codes, job.decoded[i]

    def _batch_family(self, max_streams: int) -> NanoBatch:
        """Nano's streams decoded together, their codec streams too (one push per step)."""
        codec = self.codec
        return NanoBatch(self.model, None if codec is None else codec.stream_batch(
            max_streams, n_quantizers=self.config.n_vq))

    def close(self) -> None:
        if self._idle_state is not None:
            self._idle_state.close()
            self._idle_state = None
        super().close()
