"""The chat template every MOSS-TTS prompt builder shares (upstream `build_user_message` and its
chat wrapping; docs/upstream-notes.md §family-2.4, §nano-5.1): the user message's fixed
segments, its fields and their labels, and the prompt-id record of the families whose prompts
are built from these pieces by ids (Delay, Local, Local v1.5)."""

from __future__ import annotations

from dataclasses import dataclass

from moss_tts.errors import InputError

# The fixed segments, in prompt order; each family's builder tokenizes them as its upstream does
USER_ROLE = "user\n"
REFERENCE_OPENER = "<user_inst>\n- Reference(s):\n"
NO_REFERENCE = "None"
TEXT_LABEL = "\n- Text:\n"
USER_CLOSER = "\n</user_inst>"
ASSISTANT_TURN_SEPARATOR = "\n"
ASSISTANT_ROLE = "assistant\n"
# Field order of the user message; a field left as None is written as the word None.
FIELDS = ("instruction", "tokens", "quality", "sound_event", "ambient_sound", "language")
LABELS = {"instruction": "Instruction", "tokens": "Tokens", "quality": "Quality",
          "sound_event": "Sound Event", "ambient_sound": "Ambient Sound", "language": "Language"}


@dataclass(frozen=True)
class PromptIds:
    """The ids a prompt is made of (§family-1.2); the model config provides them."""

    n_vq: int
    im_start: int
    im_end: int
    audio_start: int
    audio_end: int
    user_slot: int       # a reference frame's row
    gen_slot: int        # the assistant (generation) slot: a continued or generated frame's row
    audio_pad: int


def check_fields(fields: dict) -> None:
    """Only the user message's FIELDS may be given."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise InputError(f"unknown prompt field(s) {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(FIELDS)}")


def field_lines(fields: dict, written=format) -> str:
    """The field block, "\\n- {label}:\\n{value}" for each of FIELDS in order, each value as
    `written` writes it (as given by default, None as the word None)."""
    return "".join(f"\n- {LABELS[f]}:\n{written(fields.get(f))}" for f in FIELDS)
