"""`DelayTTS`: text → 24 kHz speech with MossTTSDelay and the MOSS-Audio-Tokenizer codec
(docs/upstream-notes.md §family-2.4-2.8). Frames are decoded as soon as the staircase completes them
(a rolling buffer of n_vq rows, P20), through the codec's exact streaming decoder, so streamed
audio equals `synthesize()` for the same seed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ..errors import ModelFileError
from ..ggml import F16, GGMLType, Weights, get_backend
from ..sampling import DelaySamplingOptions
from ..text.languages import LANGUAGES_V15
from .delay import KIND, MAX_NEW_ROWS, TOKENIZER_KEY, DelayModel, matmul_only
from .delay_decode import DelayBatch
from .chunk_ladder import WHOLE_PUSHES, ChunkLadder, chunk_frames_of
from .delay_published import is_published_dir, load_published
from .long_text import speak, split_long_text
from .message_tts import MessageTTS
from .tts import BudgetMeter, FrameBudget, Reference, family_stream


class FrameAssembler:
    """Generated rows' audio channels in, complete frames out: frame t is whole once row
    t + n_vq − 1 arrived (codebook k of frame t sits on row t + k, §family-2.5); n_vq rows are
    kept."""

    def __init__(self, n_vq: int):
        self.n_vq = n_vq
        self.rows: list[np.ndarray] = []

    def push(self, codes: np.ndarray) -> np.ndarray | None:
        """One row's codes [n_vq] → the frame it completes [n_vq], or None."""
        self.rows.append(np.asarray(codes))
        if len(self.rows) < self.n_vq:
            return None
        frame = np.array([self.rows[k][k] for k in range(self.n_vq)])
        self.rows.pop(0)
        return frame


class DelayTTS(MessageTTS):
    """MOSS-TTS (MossTTSDelay). `DelayTTS.load("delay.gguf", codec="codec.gguf")`, then
    `synthesize(text, reference=tts.encode_reference(samples, sr))` → (samples [n, 1], 24000).

    >>> tts = DelayTTS.load("delay.gguf", codec="codec.gguf")               # doctest: +SKIP
    >>> audio, sr = tts.synthesize("Hello there.", seed=1)                  # doctest: +SKIP
    """

    FAMILY, NAME, OPTIONS = KIND, "MOSS-TTS (Delay)", DelaySamplingOptions
    KEYWORDS = ("max_new_rows", "language", "instruction", "tokens", "seconds", "prompt_text")
    TOKENIZER_KEY = TOKENIZER_KEY
    # new rows of one request: the backbone's 40960 positions (upstream's Qwen3 context) hold
    # the prompt and the rows, 54 min of speech at 12.5 rows/s; no more can be used
    BUDGET = FrameBudget("max_new_rows", MAX_NEW_ROWS, 40960, "rows", per_chunk=True)
    # the `language` field's values (name, code): one file may hold 1.0 or v1.5, so v1.5's 31
    LANGUAGES = LANGUAGES_V15
    BATCHED = DelayBatch     # several streams per decode step (its published tasks' too)
    WHOLE = WHOLE_PUSHES          # whole audio: fixed pushes (chunk_ladder.py)

    def __init__(self, model, codec):
        super().__init__(model, codec)
        self._check_checkpoint()

    def _check_checkpoint(self) -> None:
        """A GGUF of one published checkpoint (MOSS-TTSD, ...) loaded by another's class would
        get the other's prompt: refused, naming the class that fits (`load_tts` picks it)."""
        from .registry import BY_KIND, CHECKPOINT_KEY, checkpoint_row

        weights = getattr(self.model, "weights", None)
        recorded = weights.file.get(CHECKPOINT_KEY) if weights is not None else None
        row = checkpoint_row(BY_KIND[KIND], recorded)
        if recorded and row.kind != self.FAMILY:
            raise ModelFileError(f"{weights.file.path}: a {row.checkpoint} GGUF, not "
                                 f"{self.NAME}: load it with load_tts() (or "
                                 f"{row.tts.split(':')[1]}.load)")

    @classmethod
    def load(cls, model, *, codec=None, backend=None, threads: int | None = None,
             kv_type: GGMLType = F16, repack: bool | None = None) -> "DelayTTS":
        """model: a Delay GGUF or upstream's published llama.cpp directory. `repack`: ggml's
        interleaved CPU layouts for the matmul weights (default: MOSS_TTS_REPACK, else on)."""
        b = get_backend(backend, threads)
        m = load_published(model, b, kv_type=kv_type, repack=repack) \
            if is_published_dir(model) else \
            DelayModel(Weights.load(model, b, repack=matmul_only(repack)), kv_type=kv_type)
        return cls._with_codec(m, codec, b)

    def forward(self, rows):
        """rows [S, 1 + n_vq] → (hidden [S, H], text_logits [S, V], audio_logits
        [n_vq, S, audio_rows]) — the research step, as `DelayModel.forward`."""
        self._need_open()
        return self.model.forward(rows)

    def generate(self, rows, **kwargs) -> np.ndarray:
        """Prompt rows → new rows [N, 1 + n_vq] (options, seed, max_new_rows)."""
        self._need_open()
        return self.model.generate(rows, **self._checked(kwargs, "max_new_rows"))

    def _stream(self, text: str, *, reference: Reference | None = None,
                prompt: Reference | None = None, prompt_text: str | None = None,
                options: DelaySamplingOptions = DelaySamplingOptions(), seed: int | None = None,
                max_new_rows: int = MAX_NEW_ROWS, normalize: bool = True, chunk_frames: int = 0,
                **fields) -> Iterator[np.ndarray]:
        """Audio chunks [m, 1] as frames complete, pushed to the codec as the chunk ladder says
        (`chunk_frames` 0; models/chunk_ladder.py) or that many frames at a time. A frame
        holding a pad code ends an audio segment (upstream decodes each segment on its own,
        §family-2.8): the next starts a new codec stream. A continuation's prompt frames go through the codec first (their audio is
        dropped, as upstream cuts it), so the output continues the prompt audio (`prompt_text`:
        its transcript, see `plan`). Long text is cut at sentence boundaries
        (models/long_text.py): each chunk an utterance of at most max_new_rows rows that
        continues the chunk before it, seed + i for chunk i."""
        chunk_frames = chunk_frames_of(chunk_frames)

        def say(chunk, prompt, prompt_text, seed, frames):
            return self._utterance(chunk, reference=reference, prompt=prompt,
                                   prompt_text=prompt_text, options=options, seed=seed,
                                   max_new_rows=max_new_rows, normalize=normalize,
                                   frames=frames, chunk_frames=chunk_frames, **fields)

        chunks = split_long_text(text, self.tokenizer, fields=fields)
        return speak(chunks, say, sample_rate=self.sample_rate, channels=self.channels,
                     prompt=prompt, prompt_text=prompt_text, seed=seed)

    # `_stream` under the family contract; a published checkpoint that speaks as Delay does
    # with keywords of its own (VoiceDesignTTS) checks them in its own contract, then calls
    # `_stream`
    stream = family_stream(_stream)

    def _utterance(self, text: str, *, reference, prompt, prompt_text, options, seed,
                   max_new_rows: int, normalize: bool, frames: list, chunk_frames: int,
                   **fields) -> Iterator[np.ndarray]:
        """One prompt's audio (what `stream` does for a text of one chunk); the complete
        generated frames without a pad code go to `frames`."""
        rows = self.plan(text, reference=reference, prompt=prompt, prompt_text=prompt_text,
                         normalize=normalize, **fields)
        yield from self._spoken(rows, prompt, options=options, seed=seed,
                                max_new_rows=max_new_rows, frames=frames,
                                chunk_frames=chunk_frames)

    def _spoken(self, rows: np.ndarray, prompt: Reference | None, *, options, seed,
                max_new_rows: int, frames: list, chunk_frames: int) -> Iterator[np.ndarray]:
        """The audio of prompt rows (`plan`): generated rows → frames → codec; with a
        continuation `prompt` (the one the rows end on), its frames start the codec stream and
        their audio is dropped."""
        assembler, pad = FrameAssembler(self.config.n_vq), self.config.audio_pad_code
        skip = 0
        if prompt is not None:   # the prompt's (cut) staircase: its last rows start the buffer
            skip = len(prompt.codes)
            staircase = rows[len(rows) - skip:, 1:]
            pending = [f for f in map(assembler.push, staircase) if f is not None]
        else:
            pending = []
        made = BudgetMeter(self._generated(rows, options=options, seed=seed,
                                           max_new_rows=max_new_rows),
                           max_new_rows, lambda row: row[0] == self.config.im_end_token_id)

        def generated():
            for row in made:
                frame = assembler.push(row[1:])
                if frame is not None and not (frame == pad).any():
                    frames.append(frame)
                yield frame

        yield from self._decode(pending, generated(), skip, chunk_frames)
        yield from made.cuts()

    def _decode(self, first: list, frames, skip: int, chunk_frames: int) -> Iterator[np.ndarray]:
        """Frames (None: not complete yet) through codec streams, one per audio segment, pushed
        as the chunk ladder says (`chunk_frames` 0) or that many at a time; the audio of the
        first `skip` frames is dropped."""
        codec, pad, n_vq = self._need_codec(), self.config.audio_pad_code, self.config.n_vq
        complete = (frame for frame in itertools.chain(first, frames) if frame is not None)
        drop = skip * codec.downsample_rate           # samples of the continuation's prompt
        for is_pad, segment in itertools.groupby(complete, key=lambda f: bool((f == pad).any())):
            if is_pad:
                continue
            with codec.stream_decoder(n_quantizers=n_vq) as decoder:
                ladder = ChunkLadder(codec.config.frame_rate, fixed=chunk_frames)
                for audio in ladder.audio(decoder, segment):
                    if drop:
                        audio, drop = audio[drop:], max(0, drop - len(audio))
                    if len(audio):
                        yield audio
