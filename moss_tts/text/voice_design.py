"""MOSS-VoiceGenerator's input normalization (docs/upstream-notes.md §family-9.2): the processor
shipped in its model repo, loaded by its app and card with `normalize_inputs=True`, cleans the
text and the instruction with two light rules of its own — not the robust `normalize_tts_text`
of the GitHub processor, which that file does not import.

Both: line breaks to spaces, `[...]` and `{...}` spans dropped, decorative brackets to the
Chinese comma, a run of sentence punctuation cut to its last mark, outer spaces stripped. The
text also loses its double quotes (the instruction keeps them); the instruction also turns
`-`, `_` into the comma and, when it holds a CJK ideograph, every ASCII comma into `，`.
"""

from __future__ import annotations

import re

_SPANS = re.compile(r"\[.*?\]|\{.*?\}")
_PUNCTUATION_RUN = re.compile(r"[，。！？,.!?;；]{2,}")
_IDEOGRAPH = re.compile("[\u4e00-\u9fff]")
_TEXT_DECORATIONS = "【】《》（）『』「」～"
_INSTRUCTION_DECORATIONS = _TEXT_DECORATIONS + "-_"


def _common(text: str, decorations: str) -> str:
    text = _SPANS.sub("", text.replace("\n", " "))
    return text.translate({ord(c): "，" for c in decorations})


def _last_of_runs(text: str) -> str:
    # upstream writes ([…])+ → \1: the group keeps its last repetition
    return _PUNCTUATION_RUN.sub(lambda m: m[0][-1], text)


def normalize_voice_text(text: str) -> str:
    """The text MOSS-VoiceGenerator speaks, as its processor cleans it.

    >>> normalize_voice_text('他说："你好！！"【笑】[laugh]\\n再见。。')
    '他说：你好，笑， 再见。'
    """
    if not text:
        return text
    return _last_of_runs(_common(text, _TEXT_DECORATIONS).replace('"', "")).strip()


def normalize_instruction(instruction: str) -> str:
    """The voice description, as MOSS-VoiceGenerator's processor cleans it.

    >>> normalize_instruction("温柔的女声（轻声）,语速缓慢!!\\n带一点笑意[smile]")
    '温柔的女声，轻声，语速缓慢! 带一点笑意'
    """
    if not instruction:
        return instruction
    text = _last_of_runs(_common(instruction, _INSTRUCTION_DECORATIONS))
    if _IDEOGRAPH.search(text):
        text = text.replace(",", "，")
    return text.strip()
