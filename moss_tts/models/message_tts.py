"""The TTS base of the families whose prompt is MossTTSDelay's user message built by ids, with
audio blocks of the 24 kHz codec's codes (docs/upstream-notes.md §family-2.4, §family-3.5):
MOSS-TTS and its published checkpoints (staircase blocks, the model samples AUDIO_START) and
MOSS-TTS-Local (blocks row for row, its processor appends AUDIO_START). References, the prompt
rows (`plan`) and the processor's normalization are written once here."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..audio import REFERENCE_MAX_SECONDS, loudness_normalize, resample, to_channels
from ..errors import InputError
from ..text.delay_prompts import build_generation_rows
from ..text.normalize import normalize_delay_text
from ..text.script import CJK_OR_HANGUL
from ..text.template import FIELDS, PromptIds
from .qwen3_tts import Qwen3TTS
from .tts import Reference


def join_transcript(transcript: str, text: str) -> str:
    """The prompt's transcript, then the new text: a space between them unless either side of
    the seam is CJK (which is written without spaces)."""
    head, tail = transcript.rstrip(), text.lstrip()
    seam = head[-1:] + tail[:1]
    return head + ("" if not head or not tail or CJK_OR_HANGUL.search(seam) else " ") + tail


class MessageTTS(Qwen3TTS):
    """The user-message families' shared half (see the module): a subclass states its model,
    budget and decoding, and how its processor lays the prompt out (DELAYED, START_AUDIO)."""

    CODEC_NAME = "the MOSS-Audio-Tokenizer (24 kHz) GGUF"
    PROMPT_FIELDS = FIELDS
    TEXT_FIELDS = tuple(f for f in FIELDS if f != "tokens")     # `tokens` is a number
    DELAYED = True       # audio blocks on the staircase (MossTTSLocal's are not)
    # a generation prompt ends at `assistant\n` and the model samples AUDIO_START itself, as
    # the Hugging Face processor and `generate` the checkpoints were trained with (§family-2.4;
    # upstream's llama.cpp pipeline appends the row instead, P4); MossTTSLocal's processor
    # appends it
    START_AUDIO = False

    @staticmethod
    def prompt_ids(c) -> PromptIds:
        return PromptIds(c.n_vq, c.im_start_token_id, c.im_end_token_id,
                         c.audio_start_token_id, c.audio_end_token_id,
                         c.audio_user_slot_token_id, c.audio_assistant_gen_slot_token_id,
                         c.audio_pad_code)

    def encode_reference(self, samples, sample_rate: int, *,
                         max_seconds: float | None = REFERENCE_MAX_SECONDS) -> Reference:
        """Reference speech → codes [frames, n_vq]: cut to max_seconds (as Nano's), mono mix, the
        codec's rate, loudness normalization (§family-1.3, on what is kept), then the codec."""
        return self._encoded_speech(self._speech(samples, sample_rate, max_seconds))

    def _speech(self, samples, sample_rate: int, max_seconds: float | None) -> np.ndarray:
        """Reference speech as the codec takes it, before loudness: cut, mono, the codec's rate."""
        codec = self._need_codec()
        x, sample_rate = self._reference_audio(samples, sample_rate, max_seconds)
        return resample(to_channels(x, 1), sample_rate, codec.sample_rate)

    def _encoded_speech(self, x: np.ndarray) -> Reference:
        """`_speech` output → its codes, loudness-normalized as a whole first (§family-1.3)."""
        codec = self._need_codec()
        return self._encoded(codec.encode(loudness_normalize(x), codec.sample_rate,
                                          n_quantizers=self.config.n_vq))

    def plan(self, text: str, *, reference: Reference | None = None,
             prompt: Reference | None = None, prompt_text: str | None = None,
             normalize: bool = True, seconds: float | None = None, **fields) -> np.ndarray:
        """The prompt rows [S, 1 + n_vq] (fields: instruction, tokens, quality, sound_event,
        ambient_sound, language — a name or code of LANGUAGES, written as its name; `seconds`
        sets `tokens`, the duration in codec frames). With
        `prompt` (continuation), upstream's text is the prompt audio's transcript, then the new
        text: give the transcript as `prompt_text` (as for Nano), or both in `text`."""
        text = self._texts(text, dict(fields, prompt_text=prompt_text))
        fields = self._prompt_fields(fields, seconds)
        reference = self._reference(reference, "reference")
        prompt = self._reference(prompt, "prompt")
        if prompt_text is not None:
            if prompt is None:
                raise InputError("prompt_text is the transcript of the prompt audio: give "
                                 "`prompt` too, or use `reference` to clone a voice")
            text = join_transcript(prompt_text, text)
        refs = None if reference is None else [reference.codes]
        return self._rows_of(text, references=refs,
                             prompt_codes=None if prompt is None else prompt.codes,
                             normalize=normalize, **fields)

    def _rows_of(self, text: str | None, *, normalize: bool, **kwargs) -> np.ndarray:
        """`build_generation_rows` with this checkpoint's layout, its generation row and, when
        `normalize`, its processor's normalization (`_normalized`)."""
        if normalize:
            text, kwargs = self._normalized(text, kwargs)
        return build_generation_rows(self.tokenizer, self.ids, text, normalize=False,
                                     start_audio=self.START_AUDIO, delayed=self.DELAYED,
                                     **kwargs)

    def _normalized(self, text: str | None, fields: dict) -> tuple[str | None, dict]:
        """The text and fields as the checkpoint's processor normalizes them: the text by
        `normalize_tts_text` (Delay's copy, §family-7), the fields as given."""
        if text is not None and text.strip():    # an empty text is build_generation_rows' error
            text = normalize_delay_text(text)
        return text, fields

    def _alone(self, rows, **keywords) -> Iterator[np.ndarray]:
        """Its model's `iter_rows` (Delay's and MossTTSLocal's, each with its own keywords)."""
        return self.model.iter_rows(rows, **keywords)
