"""`LocalTTS`: text → 24 kHz speech with MossTTSLocal and the MOSS-Audio-Tokenizer codec
(docs/upstream-notes.md §family-3). Every generated row is a whole frame (no delay), decoded through
the codec's exact streaming decoder in chunks sized by upstream's adaptive ladder (§family-4.7) or a
fixed size, so streamed audio equals the offline decode of the same frames (to f32 kernel
order) whatever the chunking.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..ggml import F16, GGMLType, Weights, get_backend
from ..sampling import LocalSamplingOptions
from ..text.languages import LANGUAGES_V1
from .chunk_ladder import WHOLE_PUSHES, ChunkLadder, chunk_frames_of
from .tts import BudgetMeter, FrameBudget, Reference, family_stream
from .local import KIND, MAX_NEW_FRAMES, TOKENIZER_KEY, LocalModel, check_n_vq
from .local_decode import LocalBatch
from .long_text import speak, split_long_text
from .message_tts import MessageTTS

class LocalTTS(MessageTTS):
    """MOSS-TTS-Local-Transformer (MossTTSLocal, 1.7B). `LocalTTS.load("local.gguf",
    codec="codec.gguf")`, then `synthesize(text, reference=tts.encode_reference(samples, sr))`
    → (samples [n, 1], 24000). Prompts and references are MessageTTS's, as Delay's (§family-3.5:
    the same template without the delay pattern and without text normalization).

    >>> tts = LocalTTS.load("local.gguf", codec="codec.gguf")               # doctest: +SKIP
    >>> audio, sr = tts.synthesize("Hello there.", seed=1)                  # doctest: +SKIP
    """

    FAMILY, NAME, OPTIONS = KIND, "MOSS-TTS-Local-Transformer", LocalSamplingOptions
    KEYWORDS = ("max_frames", "language", "instruction", "tokens", "seconds",
                "n_vq_for_inference", "prompt_text")
    TOKENIZER_KEY = TOKENIZER_KEY
    DELAYED = False
    START_AUDIO = True   # its processor appends the AUDIO_START row (§family-3.5)
    # several streams per decode step: set here, not inherited, as `_rows_audio` (not Delay's
    # stream path) takes the rows
    BATCHED = LocalBatch
    # the `language` field's values: the 1.7B is a MOSS-TTS 1.0 release (the v1.5 card's
    # models table), and 1.0 speaks 20 languages (§family-7.2)
    LANGUAGES = LANGUAGES_V1
    # frames of one request: the Qwen3-1.7B backbone's 40960 positions (upstream's context)
    # hold the prompt and the frames, 54 min of speech at 12.5 frames/s; no more can be used
    BUDGET = FrameBudget("max_frames", MAX_NEW_FRAMES, 40960, "frames", per_chunk=True)
    WHOLE = WHOLE_PUSHES          # whole audio: fixed pushes (chunk_ladder.py)

    @classmethod
    def load(cls, model, *, codec=None, backend=None, threads: int | None = None,
             kv_type: GGMLType = F16) -> "LocalTTS":
        b = get_backend(backend, threads)
        return cls._with_codec(LocalModel(Weights.load(model, b), kv_type=kv_type), codec, b)

    def plan(self, text: str, *, normalize: bool = False, **kwargs) -> np.ndarray:
        """The prompt rows [S, 1 + n_vq], as Delay's `plan` but undelayed and, as upstream's
        Local processor, without text normalization unless asked."""
        return super().plan(text, normalize=normalize, **kwargs)

    def forward(self, rows, **kwargs) -> np.ndarray:
        """rows [S, 1 + n_vq] → the backbone's hidden states [S, H] (`LocalModel.forward`)."""
        self._need_open()
        return self.model.forward(rows, **kwargs)

    def depth_logits(self, hidden_row, row):
        """Per-channel logits of one frame, `row` teacher-forced (`LocalModel.depth_logits`)."""
        self._need_open()
        return self.model.depth_logits(hidden_row, row)

    def generate(self, rows, **kwargs) -> np.ndarray:
        """Prompt rows → new rows [N, 1 + n_vq] (options, seed, max_new_frames,
        n_vq_for_inference)."""
        self._need_open()
        return self.model.generate(rows, **self._checked(kwargs, "max_new_frames"))

    @family_stream
    def stream(self, text: str, *, reference: Reference | None = None,
               prompt: Reference | None = None,
               options: LocalSamplingOptions = LocalSamplingOptions(), seed: int | None = None,
               max_frames: int = MAX_NEW_FRAMES, n_vq_for_inference: int | None = None,
               chunk_frames: int = 0, normalize: bool = False, **fields) -> Iterator[np.ndarray]:
        """Audio chunks [m, 1] as frames are generated (at most max_frames, the name Nano's
        `stream` gives its budget), the audio-end row's codes included (upstream decodes that
        trailing frame, P9). chunk_frames 0 sizes chunks by the adaptive ladder (it follows
        the clock, so two runs may chunk differently and agree to f32 kernel order only), else
        that many frames each (bit-identical runs). With `prompt` (continuation) the prompt's
        frames prime the codec and their audio is dropped, so the output continues the prompt
        audio. Long text is cut at sentence boundaries (models/long_text.py): each chunk an
        utterance of at most max_frames frames continuing the chunk before it (`prompt_text`:
        the prompt audio's transcript, as Delay's). n_vq_for_inference < n_vq generates and
        decodes that many codebooks (upstream's processor would decode its zero-filled channels
        as code 0; decoding the first n is the codec's variable-bitrate route)."""
        codec = self._need_codec()
        n = check_n_vq(n_vq_for_inference, self.config)
        chunk_frames = chunk_frames_of(chunk_frames)
        prompt_text = fields.pop("prompt_text", None)

        def say(chunk, prompt, prompt_text, seed, frames):
            rows = self.plan(chunk, reference=reference, prompt=prompt, prompt_text=prompt_text,
                             normalize=normalize, **fields)
            return self._rows_audio(codec, rows, prompt, n, chunk_frames, frames,
                                    options=options, seed=seed, max_new_frames=max_frames,
                                    n_vq_for_inference=n)

        chunks = split_long_text(text, self.tokenizer, fields=fields)
        return speak(chunks, say, sample_rate=self.sample_rate, channels=self.channels,
                     prompt=prompt, prompt_text=prompt_text, seed=seed)

    def _rows_audio(self, codec, rows, prompt, n: int, chunk_frames: int, frames: list,
                   **generation) -> Iterator[np.ndarray]:
        """One prompt's audio (what `stream` does for a text of one chunk); every generated
        row's codes [n_vq] go to `frames` (channels past n are upstream's zeros, P9)."""
        made = BudgetMeter(self._generated(rows, **generation), generation["max_new_frames"],
                           lambda row: row[0] == self.config.audio_end_token_id)

        def generated():
            for row in made:
                frames.append(row[1:])
                yield row[1:1 + n]

        with codec.stream_decoder(n_quantizers=n) as decoder:
            if prompt is not None and len(prompt.codes):
                decoder.push(np.asarray(prompt.codes)[:, :n].T)   # primes the causal state
            ladder = ChunkLadder(codec.config.frame_rate, fixed=chunk_frames)
            yield from ladder.audio(decoder, generated())
        yield from made.cuts()
