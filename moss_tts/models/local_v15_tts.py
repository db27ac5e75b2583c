"""`LocalV15TTS`: text → 48 kHz stereo speech with MOSS-TTS-Local-Transformer-v1.5 and the
MOSS-Audio-Tokenizer-v2 codec (docs/upstream-notes.md §family-4.5-4.7). Frames go through the
codec's exact streaming decoder in chunks sized by the adaptive ladder (chunk_ladder.py), so
streamed audio equals `synthesize()` (fixed pushes) for the same seed, to the codec's f32 sums.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..audio import REFERENCE_MAX_SECONDS, loudness_normalize, resample, to_channels
from ..errors import InputError
from ..sampling import LocalV15SamplingOptions
from ..text.chunking import continuation_prompt_text
from ..text.languages import LANGUAGES_V15
from ..text.local_v15_prompts import build_prompt_rows
from ..text.template import FIELDS, PromptIds
from .chunk_ladder import WHOLE_PUSHES, ChunkLadder, chunk_frames_of
from .tts import BudgetMeter, FrameBudget, Reference, family_stream
from .local_v15 import KIND, MAX_FRAMES, TOKENIZER_KEY, LocalV15Model
from .local_v15_decode import LocalV15Batch
from .long_text import speak, split_long_text
from .qwen3_tts import Qwen3TTS

class LocalV15TTS(Qwen3TTS):
    """MOSS-TTS-Local-Transformer-v1.5. `LocalV15TTS.load("local-v15.gguf",
    codec="codec-v2.gguf")`, then `synthesize(text, reference=(samples, sr))` → (samples
    float32 [n, 2], 48000).

    >>> tts = LocalV15TTS.load("local-v15.gguf", codec="codec-v2.gguf")      # doctest: +SKIP
    >>> audio, sr = tts.synthesize("Hello there.", seed=1234)               # doctest: +SKIP
    """

    CODEC_NAME = "the MOSS-Audio-Tokenizer-v2 (48 kHz stereo) GGUF"
    FAMILY, NAME, OPTIONS = KIND, "MOSS-TTS-Local-Transformer-v1.5", LocalV15SamplingOptions
    KEYWORDS = ("max_frames", "language", "instruction", "tokens", "seconds", "prompt_text")
    CHANNELS = 2                      # the 48 kHz stereo codec v2
    MODEL, TOKENIZER_KEY = LocalV15Model, TOKENIZER_KEY
    BATCHED = LocalV15Batch           # several streams per decode step (models/batching.py)
    PROMPT_FIELDS = FIELDS            # upstream's user-message fields, as Delay's
    LANGUAGES = LANGUAGES_V15         # the `language` field's values (v1.5 card: 31)
    TEXT_FIELDS = tuple(f for f in FIELDS if f != "tokens")     # `tokens` is a number
    # frames of one request: the Qwen3-4B backbone's 40960 positions (its context) hold the
    # prompt and the frames, 54 min of speech at 12.5 frames/s; no more can be used
    BUDGET = FrameBudget("max_frames", MAX_FRAMES, 40960, "frames", per_chunk=True)
    WHOLE = WHOLE_PUSHES          # whole audio: fixed pushes (chunk_ladder.py)

    @staticmethod
    def prompt_ids(c) -> PromptIds:
        return PromptIds(c.n_vq, c.im_start_token_id, c.im_end_token_id, c.audio_start_token_id,
                         c.audio_end_token_id, c.audio_user_slot_token_id,
                         c.audio_assistant_slot_token_id, c.audio_pad_token_id)

    def encode_reference(self, samples, sample_rate: int, *,
                         max_seconds: float | None = REFERENCE_MAX_SECONDS) -> Reference:
        """Reference speech → codes [frames, n_vq]: cut to max_seconds, two channels (mono is
        duplicated, P22), the codec's rate, loudness normalization over both channels (§family-1.3),
        then the codec."""
        codec = self._need_codec()
        x, sample_rate = self._reference_audio(samples, sample_rate, max_seconds)
        x = resample(to_channels(x, 2), sample_rate, codec.sample_rate)
        return self._encoded(codec.encode(loudness_normalize(x), codec.sample_rate,
                                          n_quantizers=self.config.n_vq))

    def plan(self, text: str, *, reference=None, prompt=None, prompt_text: str | None = None,
             seconds: float | None = None, **fields) -> np.ndarray:
        """The prompt rows [S, 1 + n_vq] (fields: instruction, tokens, quality, sound_event,
        ambient_sound, language — a name or code of LANGUAGES, written as its name; `seconds`
        sets `tokens`, the duration in frames). With
        `prompt` (continuation), upstream's text is the prompt audio's transcript, then the new
        text: give the transcript as `prompt_text` (joined by a space unless it is CJK) or
        write both into `text`."""
        text = self._texts(text, dict(fields, prompt_text=prompt_text))
        fields = self._prompt_fields(fields, seconds)
        if prompt_text is not None:
            if prompt is None:
                raise InputError("prompt_text is the transcript of a continuation prompt: give "
                                 "prompt= (its audio or codes) too")
            text = continuation_prompt_text(prompt_text) + text
        reference = self._reference(reference, "reference")
        prompt = self._reference(prompt, "prompt")
        return build_prompt_rows(self.tokenizer, self.ids, text,
                                 references=None if reference is None else [reference.codes],
                                 prompt_codes=None if prompt is None else prompt.codes, **fields)

    def forward(self, rows) -> np.ndarray:
        """rows [S, 1 + n_vq] → backbone hidden [S, H] (`LocalV15Model.forward`)."""
        self._need_open()
        return self.model.forward(rows)

    def depth_logits(self, hidden_row, codes=()):
        """(continue/stop logits [2], audio logits per channel) — `LocalV15Model.depth_logits`."""
        self._need_open()
        return self.model.depth_logits(hidden_row, codes)

    def generate(self, rows, **kwargs) -> np.ndarray:
        """Prompt rows → new rows [N, 1 + n_vq] (options, seed, max_frames)."""
        self._need_open()
        return self.model.generate(rows, **self._checked(kwargs, "max_frames"))

    @family_stream
    def stream(self, text: str, *, reference=None, prompt=None, prompt_text: str | None = None,
               options: LocalV15SamplingOptions = LocalV15SamplingOptions(),
               seed: int | None = None, max_frames: int = MAX_FRAMES, chunk_frames: int = 0,
               **fields) -> Iterator[np.ndarray]:
        """Audio chunks [m, 2] as frames are generated. `chunk_frames` 0 is upstream's adaptive
        ladder (4 frames first, then by how far generation leads playback), else a fixed push
        size. A continuation's prompt codes go through the codec first (their audio dropped,
        as upstream trims it), so the output continues the prompt audio. Long text is cut at
        sentence boundaries (models/long_text.py): each chunk an utterance of at most max_frames
        frames continuing the chunk before it, seed + i for chunk i. Arguments are checked
        before the first frame."""
        codec = self._need_codec()
        chunk_frames = chunk_frames_of(chunk_frames)
        chunks = split_long_text(text, self.tokenizer, fields=fields)

        def frames_of(chunk, prompt, prompt_text, seed):
            rows = self.plan(chunk, reference=reference, prompt=prompt, prompt_text=prompt_text,
                             **fields)
            return BudgetMeter(self._generated(rows, options=options, seed=seed,
                                               max_frames=max_frames), max_frames)

        # the first chunk's generator is made now: every argument is checked here, before any
        # frame (iter_frames checks before it returns its generator)
        first = [frames_of(chunks[0], prompt, prompt_text, seed)]

        def say(chunk, prompt, prompt_text, seed, frames):
            made = first.pop() if first else frames_of(chunk, prompt, prompt_text, seed)
            yield from self._decode(codec, made, prompt, frames,
                                    ChunkLadder(codec.config.frame_rate, fixed=chunk_frames))
            yield from made.cuts()

        return speak(chunks, say, sample_rate=self.sample_rate, channels=self.channels,
                     prompt=prompt, prompt_text=prompt_text, seed=seed)

    def _decode(self, codec, generated, prompt, frames: list,
                ladder: ChunkLadder) -> Iterator[np.ndarray]:
        """One prompt's audio; its generated frames also go to `frames`."""
        with codec.stream_decoder(n_quantizers=self.config.n_vq) as decoder:
            if prompt is not None:
                decoder.push(prompt.codes.T)

            def kept():
                for codes in generated:
                    frames.append(codes)
                    yield codes
            yield from ladder.audio(decoder, kept())
