"""`NanoTTS`: text → 48 kHz stereo speech with MOSS-TTS-Nano and its codec (nano.md §4-9).

Text is normalized and (voice cloning) cut into chunks by upstream's rules; each chunk is its own
utterance: a prompt, frames until the model stops or the frame budget ends, codec decode, and the
upstream pause after it. `stream()` yields audio as frames are generated, through the codec's
exact streaming decoder, so streamed audio equals `synthesize()` for the same seed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..audio import REFERENCE_MAX_SECONDS, as_samples, trim_reference
from ..codec import Codec
from ..errors import InputError, ModelFileError
from ..ggml import Weights, get_backend
from ..ggml.backend import NativeResource, released_on_error
from ..sampling import SamplingOptions, decide_continue, sample_audio_code
from ..text import (NanoPromptIds, SentencePieceTokenizer, build_rows, pause_samples,
                    prepare_texts, split_into_chunks)
from .nano import TOKENIZER_KEY, NanoModel

logger = logging.getLogger(__name__)

MAX_FRAMES = 1000          # hard cap per chunk (80 s); upstream's fixed 375 cuts long endings
FRAMES_PER_TOKEN = 6.0     # generous: speech runs ~2-4 frames (80 ms) per text token
MIN_FRAMES = 64
STALL_FRAMES = 50          # 4 s of one identical frame is a runaway, not speech
# Generation states are sized in steps of this many rows, so the next utterance can usually
# reuse the last one (caches allocated and graphs built): the step graph attends over every
# slot, but masked slots cost flash attention next to nothing
STATE_ROWS_STEP = 256


@dataclass(frozen=True)
class Reference:
    """A voice: the codec codes [frames, n_vq] of reference speech."""

    codes: np.ndarray


def frame_budget(n_text_tokens: int, cap: int = MAX_FRAMES) -> int:
    """Frames a chunk may use: scales with its text, never above `cap`."""
    return int(min(cap, max(MIN_FRAMES, math.ceil(FRAMES_PER_TOKEN * n_text_tokens) + 50)))


class NanoTTS(NativeResource):
    """MOSS-TTS-Nano. `NanoTTS.load("nano.gguf", codec="codec-nano.gguf")`, then
    `synthesize(text, reference=(samples, sr))` → (samples float32 [n, 2], 48000).

    >>> tts = NanoTTS.load("nano.gguf", codec="nano-codec.gguf")          # doctest: +SKIP
    >>> audio, sr = tts.synthesize("Hello there.", seed=1)                  # doctest: +SKIP
    """

    def __init__(self, model: NanoModel, codec: Codec | None):
        self.model = model
        self.config = model.config
        self.codec = codec
        self._idle_state = None  # the last utterance's generation state, kept for the next
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
        m = NanoModel(Weights.load(model, b))
        # a codec that fails to load or to fit frees the model (and the codec loaded here)
        with released_on_error(m):
            owned = Codec.load(codec, backend=b) if codec is not None \
                and not isinstance(codec, Codec) else None
            with released_on_error(owned):
                return cls(m, owned or codec)

    def _check_codec(self, codec: Codec) -> None:
        c = self.config
        problems = []
        if codec.channels != 2 or codec.sample_rate != c.sample_rate:
            problems.append(f"it is {codec.sample_rate} Hz x {codec.channels} channel(s), the "
                            f"model needs {c.sample_rate} Hz stereo")
        if codec.n_quantizers < c.n_vq or codec.config.codebook_size != c.audio_vocab_size:
            problems.append(f"it has {codec.n_quantizers} codebooks of {codec.config.codebook_size}, "
                            f"the model needs {c.n_vq} of {c.audio_vocab_size}")
        if problems:
            raise ModelFileError("mismatched codec: " + "; ".join(problems) +
                                 " — pass the MOSS-Audio-Tokenizer-Nano GGUF")

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    # -- references ---------------------------------------------------------------------------
    def encode_reference(self, samples, sample_rate: int, *,
                         max_seconds: float | None = REFERENCE_MAX_SECONDS) -> Reference:
        """Reference speech → its first n_vq codebooks, [frames, n_vq] (mono is duplicated).
        Audio past max_seconds is cut with a warning (None keeps it all: a continuation prompt
        must match its text)."""
        x = as_samples(samples, what="reference audio")
        if max_seconds is not None:
            x = trim_reference(x, int(sample_rate), max_seconds)
        codes = self._need_codec().encode(x, int(sample_rate), n_quantizers=self.config.n_vq)
        return Reference(np.ascontiguousarray(codes.T))

    # -- generation -----------------------------------------------------------------------------
    def iter_frames(self, rows: np.ndarray, *, options: SamplingOptions = SamplingOptions(),
                    seed: int | None = None, max_frames: int = MAX_FRAMES) -> Iterator[np.ndarray]:
        """Frames [n_vq] generated after prompt rows, until the model stops (nano.md §4.1)."""
        cfg, m = self.config, self.model
        if max_frames < 1:
            raise InputError(f"max_frames must be at least 1, got {max_frames}")
        rng = np.random.default_rng(seed) if options.do_sample else None
        seen = np.zeros((cfg.n_vq, cfg.audio_vocab_size), dtype=bool)  # per-channel history
        state = self._take_state(len(rows) + max_frames)
        try:
            h = m.prefill(state, rows)
            last, same = None, 0
            for _ in range(max_frames):
                codes = m.frame(state, h, lambda c, logits: sample_audio_code(
                    logits, seen[c], rng, options), lambda a, b: decide_continue(a, b, rng, options))
                if codes is None:
                    return
                seen[np.arange(cfg.n_vq), codes] = True
                yield codes
                same = same + 1 if last is not None and np.array_equal(codes, last) else 0
                if same >= STALL_FRAMES:
                    logger.warning("stopping: %d identical frames in a row", same)
                    return
                last = codes
                h = m.prefill(state, m.frame_row(codes))
            logger.info("frame budget of %d reached", max_frames)
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
        frames = list(self.iter_frames(rows, **kwargs))
        return np.array(frames, dtype=np.int32).reshape(len(frames), self.config.n_vq)

    def plan(self, text: str, *, reference: Reference | None = None, prompt_text: str | None = None,
             prompt: Reference | None = None, normalize: bool = True,
             max_text_tokens: int = 75) -> list[tuple[str, np.ndarray]]:
        """The utterances of a request: (chunk text, prompt rows), chunked when cloning a voice."""
        if not isinstance(text, str) or not text.strip():
            raise InputError("text is empty")
        if normalize:
            prepared = prepare_texts(text, prompt_text)
            text, prompt_text = prepared.text, prepared.prompt_text
        mode = "voice_clone" if reference is not None else "continuation"
        chunks = split_into_chunks(text, self.tokenizer, max_text_tokens) if reference is not None \
            else [text]
        return [(chunk, build_rows(self.tokenizer, chunk, mode=mode, ids=self.ids,
                                   reference_codes=None if reference is None else reference.codes,
                                   prompt_text=prompt_text,
                                   prompt_codes=None if prompt is None else prompt.codes))
                for chunk in chunks]

    def stream(self, text: str, *, reference: Reference | None = None,
               prompt_text: str | None = None, prompt: Reference | None = None,
               options: SamplingOptions = SamplingOptions(), seed: int | None = None,
               max_frames: int = MAX_FRAMES, normalize: bool = True,
               max_text_tokens: int = 75) -> Iterator[np.ndarray]:
        """Audio chunks [m, 2] as frames are generated; the pauses between text chunks too.

        Each text chunk is its own utterance with a fresh repetition history (as upstream);
        with a seed, chunk i samples from `seed + i`, so a request is reproducible. With a
        continuation prompt, the codec stream first decodes the prompt (discarded), so the
        output continues it seamlessly.
        """
        codec = self._need_codec()
        plan = self.plan(text, reference=reference, prompt_text=prompt_text, prompt=prompt,
                         normalize=normalize, max_text_tokens=max_text_tokens)
        for i, (chunk, rows) in enumerate(plan):
            budget = frame_budget(len(self.tokenizer.encode(chunk)), max_frames)
            with codec.stream_decoder(n_quantizers=self.config.n_vq) as decoder:
                if prompt is not None:  # continuation: the codec stream continues the prompt
                    decoder.push(prompt.codes.T)
                chunk_seed = None if seed is None else seed + i
                for codes in self.iter_frames(rows, options=options, seed=chunk_seed,
                                              max_frames=budget):
                    yield decoder.push(codes[:, None])
            if i + 1 < len(plan):
                yield np.zeros((pause_samples(chunk, self.sample_rate), 2), dtype=np.float32)

    def synthesize(self, text: str, **kwargs) -> tuple[np.ndarray, int]:
        """Text → (samples float32 [n, 2], sample_rate). Same options as `stream`."""
        parts = list(self.stream(text, **kwargs))
        audio = np.concatenate(parts) if parts else np.zeros((0, 2), np.float32)
        return audio, self.sample_rate

    def _need_codec(self) -> Codec:
        if self.codec is None:
            raise InputError("no codec loaded: pass codec=... (the MOSS-Audio-Tokenizer-Nano GGUF)")
        return self.codec

    def close(self) -> None:
        if getattr(self, "_idle_state", None) is not None:
            self._idle_state.close()
            self._idle_state = None
        if getattr(self, "codec", None) is not None:
            self.codec.close()
            self.codec = None
        if getattr(self, "model", None) is not None:
            self.model.close()
            self.model = None
