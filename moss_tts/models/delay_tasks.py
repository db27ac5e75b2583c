"""MossTTSDelay's other published checkpoints (docs/upstream-notes.md §family-9): the runtime,
codec path and long-text handling of `DelayTTS`, with the prompt and the task of each.

- `DialogueTTS` — MOSS-TTSD v1.0: a dialogue tagged `[S1]` … `[S5]`, one optional reference per
  speaker with its transcript, spoken in upstream's continuation workflow (its app's
  `run_inference`): the references' codes per speaker in the user message, the speakers' prompt
  speech concatenated as the assistant prefix, their transcripts leading the text.
- `VoiceDesignTTS` — MOSS-VoiceGenerator: a voice made from a description (`instruction`),
  no reference.
- `SoundEffectTTS` — MOSS-SoundEffect: sound from a description (`ambient_sound`), its duration
  in `tokens` (12.5 a second) or `seconds`; no text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..audio import REFERENCE_MAX_SECONDS
from ..errors import InputError
from ..reference import Reference, unwrapped
from ..sampling import (DialogueSamplingOptions, SoundEffectSamplingOptions,
                        VoiceDesignSamplingOptions)
from ..speakers import MAX_TRANSCRIPT_CHARS
from ..text.languages import LANGUAGES_V1
from ..text.voice_design import normalize_instruction, normalize_voice_text
from ..text.dialogue import (MAX_SPEAKERS, check_dialogue, check_tags, merge_turns,
                             normalize_dialogue, split_dialogue, tag_transcript)
from .tts import FrameBudget, check_text, described_sound, family_stream
from .chunk_ladder import chunk_frames_of
from .delay import MAX_NEW_ROWS
from .delay_tts import DelayTTS
from .long_text import speak


@dataclass(frozen=True)
class Speaker:
    """One voice of a dialogue: its reference speech, in any form a reference takes, and what
    that speech says (MOSS-TTSD continues from the speaker's words, so upstream requires both)."""

    reference: object
    transcript: str


@dataclass(frozen=True)
class Cast:
    """A dialogue's voices as the prompt takes them: per speaker its codes or None (the user
    message's references), their speech as one continuation prompt and their tagged
    transcripts, in speaker order (None when no speaker has a reference: generation mode)."""

    references: list
    prompt: Reference | None
    prompt_text: str | None


class DialogueTTS(DelayTTS):
    """MOSS-TTSD v1.0. `synthesize("[S1] Hi. [S2] Hello!", speakers=[("alice" speech, its
    transcript), (bob's, his)])`: a speaker's entry is a `Speaker`, a (reference, transcript) pair,
    a Reference carrying its transcript (a voice stored with one) or None; `speakers` is a list
    (entry i is [S{i+1}]) or a {number: entry} dict. Without references the model picks the
    voices (generation mode). Long dialogues are cut at speaker turns, each chunk continuing
    the one before it, so the voices hold."""

    FAMILY, NAME, OPTIONS = "ttsd", "MOSS-TTSD v1.0", DialogueSamplingOptions
    KEYWORDS = ("max_new_rows", "speakers", "language")
    TEXT_FIELDS = ("language",)
    LANGUAGES = LANGUAGES_V1              # its card's 20 (section 1.5)

    def plan(self, text: str, *, speakers=None, cast: Cast | None = None,
             prompt: Reference | None = None, prompt_text: str | None = None,
             normalize: bool = True, language: str | None = None) -> np.ndarray:
        """The prompt rows of one dialogue chunk. `cast` (from `cast(speakers)`) saves encoding
        the speakers again; `prompt`/`prompt_text` continue a chunk before this one (else the
        speakers' own speech and transcripts are the continuation, as upstream's)."""
        cast = cast or self.cast(speakers)
        return self._rows(self.dialogue(text, normalize=normalize), cast,
                          prompt, prompt_text, normalize=normalize, language=language)

    def _rows(self, text: str, cast: Cast, prompt: Reference | None, prompt_text: str | None, *,
              normalize: bool, language: str | None) -> np.ndarray:
        """`plan` of a dialogue already normalized and checked."""
        if prompt is None and cast.prompt is not None:
            prompt, prompt_text = cast.prompt, cast.prompt_text
        if prompt_text:    # upstream's _build_prefixed_text, then the same checks again
            text = self.dialogue(merge_turns(prompt_text + text), normalize=normalize)
        references = cast.references if any(r is not None for r in cast.references) else None
        return self._rows_of(text, references=references,
                             prompt_codes=None if prompt is None else prompt.codes,
                             normalize=normalize, **self._prompt_fields({"language": language}))

    @staticmethod
    def dialogue(text: str, *, normalize: bool = True) -> str:
        """The dialogue as upstream's app hands it on: normalized (its normalize_text, on by
        default there too), then checked (a speaker tag at least, every tag [S1] to [S5]).
        A speaker with no voice given is the model's choice, whatever its number."""
        check_tags(text, shorthand=normalize)      # before the cleanup drops a tag's `-`
        text = normalize_dialogue(text) if normalize else text.strip()
        check_dialogue(text)
        return text

    def cast(self, speakers) -> Cast:
        """`speakers` (see the class) → their references, prompt speech and transcripts. Each
        reference is encoded alone for the user message; the prompt speech is the speakers'
        speech concatenated and encoded at once (upstream's concat_prompt_wav), or their codes
        concatenated where a speaker is given as codes or a stored voice."""
        entries = speaker_entries(speakers)
        count = max(entries, default=0)
        references, speech, codes, tagged = [], [], [], []
        for n in range(1, count + 1):
            reference, transcript = entries.get(n, (None, None))
            if reference is None:
                if transcript is not None:
                    raise InputError(f"speakers: speaker {n} has a transcript but no reference "
                                     "speech: give both, or neither")
                references.append(None)
                continue
            if transcript is None:
                raise InputError(f"speakers: speaker {n} has reference speech but no transcript:"
                                 " MOSS-TTSD needs what it says (speaker=reference:transcript)")
            if not check_text(transcript, f"speakers: speaker {n}'s transcript").strip():
                raise InputError(f"speakers: speaker {n}'s transcript is empty")
            if len(transcript) > MAX_TRANSCRIPT_CHARS:      # as every front end bounds it
                raise InputError(f"speakers: speaker {n}'s transcript must be at most "
                                 f"{MAX_TRANSCRIPT_CHARS} characters, got {len(transcript)}")
            ref = self._reference(reference, f"speakers: speaker {n}'s reference")
            references.append(ref.codes)
            codes.append(ref.codes)
            tagged.append(tag_transcript(transcript, n))
            if isinstance(reference, tuple) and not isinstance(reference[0], Reference):
                speech.append(self._speech(*reference, max_seconds=REFERENCE_MAX_SECONDS))
        if not codes:
            return Cast(references, None, None)
        prompt = self._encoded_speech(np.concatenate(speech)) if len(speech) == len(codes) \
            else Reference(np.concatenate(codes))
        return Cast(references, prompt, "".join(tagged))

    @family_stream
    def stream(self, text: str, *, speakers=None,
               options: DialogueSamplingOptions = DialogueSamplingOptions(),
               seed: int | None = None, max_new_rows: int = MAX_NEW_ROWS, normalize: bool = True,
               language: str | None = None, chunk_frames: int = 0) -> Iterator[np.ndarray]:
        """Audio chunks [m, 1] of the dialogue as frames complete (see DelayTTS.stream)."""
        chunk_frames = chunk_frames_of(chunk_frames)
        cast = self.cast(speakers)
        text = self.dialogue(text, normalize=normalize)

        def say(chunk, prompt, prompt_text, seed, frames):
            rows = self._rows(chunk, cast, prompt, prompt_text, normalize=normalize,
                              language=language)
            return self._spoken(rows, prompt or cast.prompt, options=options, seed=seed,
                                max_new_rows=max_new_rows, frames=frames,
                                chunk_frames=chunk_frames)

        return speak(split_dialogue(text, self.tokenizer), say, sample_rate=self.sample_rate,
                     channels=self.channels, seed=seed)


def speaker_entries(speakers) -> dict[int, tuple[object, str | None]]:
    """`speakers` → {speaker number: (reference or None, transcript or None)}; one InputError
    naming `speakers` for anything else."""
    if speakers is None:
        return {}
    if isinstance(speakers, Mapping):
        items = list(speakers.items())
    elif isinstance(speakers, (list, tuple)):
        items = list(enumerate(speakers, 1))
    else:
        raise InputError(f"speakers must be a list or a {{number: speaker}} dict, got "
                         f"{type(speakers).__name__}")
    out = {}
    for number, entry in items:
        if isinstance(number, bool) or not isinstance(number, int) \
                or not 1 <= number <= MAX_SPEAKERS:
            raise InputError(f"speakers: speaker numbers are 1 to {MAX_SPEAKERS} (MOSS-TTSD's "
                             f"[S1] … [S{MAX_SPEAKERS}]), got {number!r}")
        out[number] = speaker_entry(entry, number)
    return out


def speaker_entry(entry, number: int) -> tuple[object, str | None]:
    if entry is None:
        return None, None
    if isinstance(entry, Speaker):
        return entry.reference, entry.transcript
    if isinstance(entry, Mapping):
        unknown = set(entry) - {"reference", "transcript"}
        if unknown:
            raise InputError(f"speakers: speaker {number} has unknown field(s) "
                             f"{', '.join(sorted(map(str, unknown)))}: use reference, transcript")
        return entry.get("reference"), entry.get("transcript")
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], (str, type(None))):
        return entry
    reference = unwrapped(entry)
    if isinstance(reference, Reference):   # a stored voice, with the transcript stored with it
        return reference, reference.transcript
    raise InputError(f"speakers: speaker {number} must be (reference, transcript), a Speaker, a "
                     f"stored voice or None, got {type(entry).__name__}")


class VoiceDesignTTS(DelayTTS):
    """MOSS-VoiceGenerator. `synthesize(text, instruction="a hearty, jovial tavern owner")`:
    the voice comes from the description alone (upstream refuses an empty one); no reference."""

    FAMILY, NAME, OPTIONS = "voicegen", "MOSS-VoiceGenerator", VoiceDesignSamplingOptions
    KEYWORDS = ("max_new_rows", "instruction", "language", "tokens", "seconds")
    REQUIRED = ("instruction",)      # the voice is made from its description
    TEXT_FIELDS = ("instruction", "language")
    # its card: "high-quality synthesis in Chinese and English"
    LANGUAGES = tuple(pair for pair in LANGUAGES_V1 if pair[1] in ("zh", "en"))

    def _normalized(self, text: str | None, fields: dict) -> tuple[str | None, dict]:
        """Its processor's `normalize_inputs` (the card and app turn it on): the text and the
        instruction by its own rules (text/voice_design.py), not Delay's normalizer."""
        instruction = fields.get("instruction")
        if instruction is not None:
            instruction = normalize_instruction(instruction)
            if not instruction:
                raise InputError("instruction: nothing is left of it once normalized (its "
                                 "[...] and {...} spans are dropped): describe the voice in "
                                 "words, or pass normalize=False")
            fields = dict(fields, instruction=instruction)
        return (None if text is None else normalize_voice_text(text)), fields

    @family_stream
    def stream(self, text: str, *, instruction: str | None = None,
               options: VoiceDesignSamplingOptions = VoiceDesignSamplingOptions(),
               seed: int | None = None, max_new_rows: int = MAX_NEW_ROWS, normalize: bool = True,
               language: str | None = None, tokens: int | None = None,
               seconds: float | None = None, chunk_frames: int = 0) -> Iterator[np.ndarray]:
        """Audio chunks [m, 1] in the described voice (see DelayTTS.stream)."""
        if instruction is None or not instruction.strip():
            raise InputError("instruction is required: MOSS-VoiceGenerator makes the voice from "
                             "a description of it (e.g. 'a calm, low female voice')")
        return self._stream(text, options=options, seed=seed, max_new_rows=max_new_rows,
                            normalize=normalize, instruction=instruction, language=language,
                            tokens=tokens, seconds=seconds, chunk_frames=chunk_frames)


class SoundEffectTTS(DelayTTS):
    """MOSS-SoundEffect. `synthesize(sound="rain on a tin roof", seconds=8)` (or the description
    as the text): upstream's message carries it as `ambient_sound` and no text."""

    FAMILY, NAME, OPTIONS = "sfx", "MOSS-SoundEffect", SoundEffectSamplingOptions
    KEYWORDS = ("max_new_rows", "sound", "tokens", "seconds")
    TEXT_FIELDS = ("sound",)
    TEXT_OPTIONAL = True
    # the description (`sound`, or the text), one prompt that is never cut into chunks: a
    # sentence or two on its card, and every surface's bound (the `sound` knob reads it too)
    MAX_TEXT_CHARS = 1024
    # one description, never cut into chunks: the budget is the whole sound's
    BUDGET = FrameBudget("max_new_rows", MAX_NEW_ROWS, DelayTTS.BUDGET.limit, "rows")

    def plan(self, text: str | None = None, *, sound: str | None = None,
             tokens: int | None = None, seconds: float | None = None) -> np.ndarray:
        """The prompt rows: the description as `ambient_sound`, the duration as `tokens`."""
        sound = described_sound(text, sound)
        return self._rows_of(None, normalize=False, ambient_sound=sound,
                             **self._prompt_fields({"tokens": tokens}, seconds))

    @family_stream
    def stream(self, text: str | None = None, *, sound: str | None = None,
               options: SoundEffectSamplingOptions = SoundEffectSamplingOptions(),
               seed: int | None = None, max_new_rows: int = MAX_NEW_ROWS,
               tokens: int | None = None, seconds: float | None = None,
               chunk_frames: int = 0) -> Iterator[np.ndarray]:
        """Audio chunks [m, 1] of the sound as frames complete (one utterance: a description
        is not cut)."""
        chunk_frames = chunk_frames_of(chunk_frames)
        rows = self.plan(text, sound=sound, tokens=tokens, seconds=seconds)

        def say(_, prompt, prompt_text, seed, frames):
            return self._spoken(rows, None, options=options, seed=seed,
                                max_new_rows=max_new_rows, frames=frames,
                                chunk_frames=chunk_frames)

        return speak([sound or text], say, sample_rate=self.sample_rate, channels=self.channels,
                     seed=seed)
