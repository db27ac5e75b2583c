"""The languages the MOSS-TTS model cards list, as (English name, code), and the prompt's
`Language` value for a name or code (docs/upstream-notes.md §family-7.2; upstream's
`moss_tts_model_card.md` for v1.5, `moss_ttsd_model_card.md` for MOSS-TTS 1.0 and MOSS-TTSD
v1.0). The prompt takes the card's English name, as upstream's examples write it (`French`).
"""

from __future__ import annotations

import re

from moss_tts.errors import InputError

# MOSS-TTS 1.0, MOSS-TTSD v1.0 and MOSS-TTS-Realtime: their tables' 19 rows and Hebrew, which
# v1.5's card counts among 1.0's 20 (§family-7.2)
LANGUAGES_V1 = (
    ("Chinese", "zh"), ("English", "en"), ("German", "de"), ("Spanish", "es"),
    ("French", "fr"), ("Japanese", "ja"), ("Italian", "it"), ("Hungarian", "hu"),
    ("Korean", "ko"), ("Russian", "ru"), ("Persian (Farsi)", "fa"), ("Arabic", "ar"),
    ("Polish", "pl"), ("Portuguese", "pt"), ("Czech", "cs"), ("Danish", "da"),
    ("Swedish", "sv"), ("Greek", "el"), ("Turkish", "tr"), ("Hebrew", "he"),
)  # fmt: skip

# MOSS-TTS v1.5 (MossTTSDelay-8B v1.5, MossTTSLocal-4B v1.5), in the card's table order.
LANGUAGES_V15 = (
    ("Chinese", "zh"), ("Cantonese", "yue"), ("English", "en"), ("Arabic", "ar"),
    ("Czech", "cs"), ("Danish", "da"), ("Dutch", "nl"), ("Finnish", "fi"), ("French", "fr"),
    ("German", "de"), ("Greek", "el"), ("Hebrew", "he"), ("Hindi", "hi"),
    ("Hungarian", "hu"), ("Italian", "it"), ("Japanese", "ja"), ("Korean", "ko"),
    ("Macedonian", "mk"), ("Malay", "ms"), ("Persian (Farsi)", "fa"), ("Polish", "pl"),
    ("Portuguese", "pt"), ("Romanian", "ro"), ("Russian", "ru"), ("Spanish", "es"),
    ("Swahili", "sw"), ("Swedish", "sv"), ("Tagalog", "tl"), ("Thai", "th"),
    ("Turkish", "tr"), ("Vietnamese", "vi"),
)  # fmt: skip

_PARTS = re.compile(r"[^()]+")


def _spellings(name: str, code: str) -> set[str]:
    """Every accepted spelling, folded: the name, the code, and each part of a name written
    with a parenthesis ("Persian (Farsi)": also "Persian" and "Farsi")."""
    parts = {p.strip() for p in _PARTS.findall(name)} - {""}
    return {s.casefold() for s in {name, code} | parts}


def language_name(value, languages) -> str:
    """The card's English name for `value`, a name or code of one of `languages` ((name, code)
    pairs), case-insensitive, surrounding space ignored; else one InputError naming
    `language` and listing them.

    >>> language_name(" FR ", LANGUAGES_V15)
    'French'
    """
    if not isinstance(value, str):
        raise InputError(f"language must be a str (a name or code such as French or fr), got "
                         f"{type(value).__name__}")
    key = value.strip().casefold()
    for name, code in languages:
        if key in _spellings(name, code):
            return name
    listed = ", ".join(f"{name} ({code})" for name, code in languages)
    raise InputError(f"language {value.strip()!r} is not one of this model's {len(languages)} "
                     f"languages; give a name or code from its model card: {listed}")
