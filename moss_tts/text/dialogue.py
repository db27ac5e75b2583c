"""MOSS-TTSD dialogue text: turns tagged `[S1]` ... `[S5]`, cleaned, checked, merged, prefixed
with the cloned speakers' transcripts, and cut at turns when long (docs/upstream-notes.md
§family-7.3). Follows upstream `clis/moss_ttsd_app.py`: `normalize_text`,
`_merge_consecutive_speaker_tags`, `_normalize_prompt_text`, `_validate_dialogue_text` and
`_build_prefixed_text`.
"""

from __future__ import annotations

import re

from moss_tts.errors import InputError
from moss_tts.text.chunking import pack_sentences

MAX_SPEAKERS = 5          # upstream's app offers 1 to 5 speakers; the card: "1 to 5 speakers"
DEFAULT_MAX_TOKENS = 200  # as the other families' long-text chunks (models/long_text.py)

_TAG = re.compile(r"\[S(\d+)\]")
_TURN = re.compile(r"(?=\[S\d+\])")                  # a turn starts at each tag
_HEAD = re.compile(r"(\[S\d+\])\s*(.*)", re.DOTALL)  # a turn's tag, then its words
_BARE_NUMBER = re.compile(r"\[(\d+)\]")              # [1] is shorthand for [S1]
# What a speaker tag was meant to be, written any way: [S1], [s1], [S 1], [S-1], [S01], and with
# the `normalize` cleanup also [1] (its shorthand) and [-1]. Only [S1]..[S5] (and [1]..[5] for
# the cleanup) are tags: the cleanup drops the `-` of [S-1] and upstream's check reads [S01] as
# 1 while the model is given "[S01]", so each other spelling would speak as another speaker.
_TAG_LIKE = re.compile(r"\[\s*(S\s*)?[-+]?\s*\d+\s*\]", re.IGNORECASE)
# Brackets, quotes, tildes, hyphens and underscores are dropped from a turn's words.
_DROPPED = re.compile("[" + re.escape("【】《》（）『』「」\"-_“”～~‘’") + "]")
_LAUGH_ZH = re.compile("哈{2,}")
_LAUGH_EN = re.compile(r"\b(ha(\s*ha)+)\b", re.IGNORECASE)
# Dashes and ellipses become a pause (a comma), longest spellings first.
_PAUSES = (("——", "，"), ("……", "，"), ("...", "，"), ("⸺", "，"), ("―", "，"), ("—", "，"),
           ("…", "，"))
# Marks inside a sentence become commas (full-width for full-width, ASCII for ASCII).
_INNER_MARKS = str.maketrans({"；": "，", ";": ",", "：": "，", ":": ",", "、": "，"})
_MARK_RUN = re.compile(r"([，。？！,.?!])[，。？！,.?!]+")   # a run keeps its first mark
_FINAL_FOR = {"，": "。", ",": "."}                          # a turn ending on a comma ends it


def _clean_words(words: str) -> str:
    """One turn's words as upstream's normalize_text cleans them."""
    words = _DROPPED.sub("", words)
    words = _LAUGH_ZH.sub("[笑]", words)
    words = _LAUGH_EN.sub("[laugh]", words)
    for spelled, pause in _PAUSES:
        words = words.replace(spelled, pause)
    words = _MARK_RUN.sub(r"\1", words.translate(_INNER_MARKS).strip())
    if len(words) > 1:   # inside the turn a full stop becomes a comma; the last mark stays
        words = words[:-1].replace("。", "，") + _FINAL_FOR.get(words[-1], words[-1])
    return words


def normalize_dialogue(text: str) -> str:
    """Upstream's TTSD text cleanup (`normalize_text`): `[n]` → `[Sn]`, newlines → spaces; per
    turn, brackets/quotes/tildes/`-`/`_` dropped, 哈哈 → `[笑]` and haha → `[laugh]`, dashes and
    ellipses → `，`, `；：、` → `，` (`;:` → `,`), a run of marks → its first, a final comma →
    a full stop and any other `。` → `，`; consecutive turns of one speaker merged, and the turns
    joined with nothing between them.

    >>> normalize_dialogue("[1] 你好。好久不见， [1]是啊…… [2] Hi!!")
    '[S1]你好，好久不见。是啊。[S2]Hi!'
    """
    text = _BARE_NUMBER.sub(r"[S\1]", text).replace("\n", " ")
    merged: list[list[str]] = []   # [tag, words] of each run of one speaker's turns
    for turn in _TURN.split(text):
        turn = turn.strip()
        if not turn:
            continue
        head = _HEAD.match(turn)
        tag, words = (head[1], head[2]) if head else ("", turn)
        words = _clean_words(words)
        if merged and tag and merged[-1][0] == tag:
            merged[-1][1] += words
        else:
            merged.append([tag, words])
    return "".join((tag + words).strip() for tag, words in merged).replace("‘", "'") \
        .replace("’", "'")


def merge_turns(text: str) -> str:
    """Consecutive turns of one speaker as one (`_merge_consecutive_speaker_tags`): the later
    tags dropped, every turn's tag followed directly by its words, turns joined with nothing.

    >>> merge_turns("[S1] Hi. [S1] Bye. [S2] Ok.")
    '[S1]Hi.Bye.[S2]Ok.'
    """
    out, current = [], None
    for turn in _TURN.split(text):
        turn = turn.strip()
        if not turn:
            continue
        head = _HEAD.match(turn)
        if head is None:           # words before the first tag stay as they are
            out.append(turn)
        elif head[1] == current:
            out.append(head[2])
        else:
            current = head[1]
            out.append(head[1] + head[2])
    return "".join(out)


def tag_transcript(transcript: str, speaker: int) -> str:
    """A cloned speaker's transcript led by its tag (`_normalize_prompt_text`): stripped, and
    `[Sn] ` put before it unless it starts with `[Sn]`; an empty one is an InputError."""
    text = (transcript or "").strip()
    if not text:
        raise InputError(f"the transcript of speaker {speaker} is empty: give the words its "
                         "reference audio speaks")
    tag = f"[S{speaker}]"
    return text if text.startswith(tag) else f"{tag} {text}"


def prefix_transcripts(text: str, transcripts: dict[int, str]) -> str:
    """The dialogue as upstream's continuation speaks it (`_build_prefixed_text`): each cloned
    speaker's tagged transcript in speaker order, then the dialogue, with consecutive turns of
    one speaker merged. `transcripts`: speaker number → transcript of its reference audio."""
    head = "".join(tag_transcript(transcripts[s], s) for s in sorted(transcripts))
    return merge_turns(head + text)


def check_tags(text: str, *, shorthand: bool = False) -> None:
    """Every speaker tag of `text` is one of [S1] ... [S{MAX_SPEAKERS}] as upstream writes them
    (with `shorthand`, as `normalize_dialogue` reads the text, [1] ... [5] too): anything else
    written as a speaker tag ([S0], [S-1], [S6], [S01], [s1], [S 1]) is a one-line InputError
    naming it, not another speaker or words."""
    for m in _TAG_LIKE.finditer(text):
        tag, written = m[0], m[1] is not None
        if not (written or shorthand):
            continue           # [3] is words unless the cleanup reads it as [S3]
        if tag not in (f"[{'S' if written else ''}{n}]" for n in range(1, MAX_SPEAKERS + 1)):
            also = "" if written else f" (or [1] to [{MAX_SPEAKERS}], which the cleanup reads so)"
            raise InputError(f"the text has the speaker tag {tag}: MOSS-TTSD's speaker tags are "
                             f"[S1] to [S{MAX_SPEAKERS}]{also}; fix the tag")


def check_dialogue(text: str) -> str:
    """`text` stripped, when it is a dialogue MOSS-TTSD can speak (`_validate_dialogue_text`):
    it has a speaker tag and its tags are [S1] to [S{MAX_SPEAKERS}] (`check_tags`). Which
    speakers have a voice is not its business: a speaker given none is the model's choice, as
    upstream's TTSD app clones S1 and leaves S2 to the model. Each problem is a one-line
    InputError saying what to change."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("text is empty: write the dialogue as [S1] words [S2] words ...")
    check_tags(text)
    if not _TAG.search(text):
        raise InputError("the text has no speaker tag: start each turn with its speaker, "
                         "[S1] words [S2] words ...")
    return text.strip()


def _turn_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each turn: from a tag to the next; words before the first tag (if any)
    are a turn of their own."""
    starts = [m.start() for m in _TAG.finditer(text)]
    if not starts or text[:starts[0]].strip():
        starts.insert(0, 0)
    return list(zip(starts, starts[1:] + [len(text)]))


def _cut_turn(turn: str, tokenizer, max_tokens: int) -> list[str]:
    """A turn over the budget, cut at sentences (then clauses, then the budget) with its tag,
    and the space after it, at the start of every piece."""
    head = _HEAD.match(turn)
    prefix = turn[:head.start(2)] if head else ""
    return [prefix + piece for piece in
            pack_sentences(turn[len(prefix):], tokenizer, max_tokens, keep_tags=True,
                           prefix=prefix)]


def split_dialogue(text: str, tokenizer, max_tokens: int = DEFAULT_MAX_TOKENS) -> list[str]:
    """A long dialogue as chunks of at most `max_tokens` tokens (`tokenizer.encode`), cut at
    speaker turns: whole turns are packed in order; a turn longer than the budget is cut at its
    sentences, each piece led by the turn's tag, and packed with no other turn. A dialogue that
    fits (or a budget <= 0) comes back as [text], unchanged. Every chunk starts with a tag
    (words before the first tag, if any, lead the first chunk); no cut falls inside a tag such
    as [laugh]. Chunks are slices of `text` (stripped), so their words are the text's.

    >>> split_dialogue("[S1] One. [S2] Two.", tok, max_tokens=4)   # doctest: +SKIP
    ['[S1] One.', '[S2] Two.']
    """
    def count(piece):
        return len(tokenizer.encode(piece))

    if int(max_tokens) <= 0 or count(text) <= max_tokens:
        return [text]
    chunks, first = [], None   # `first`: where the chunk being packed starts in `text`
    for start, end in _turn_spans(text):
        turn = text[start:end].strip()
        if first is not None and count(text[first:end].strip()) <= max_tokens:
            continue           # the turn joins the chunk being packed
        if first is not None:
            chunks.append(text[first:start].strip())
            first = None
        if count(turn) <= max_tokens:
            first = start
        else:
            chunks += _cut_turn(turn, tokenizer, max_tokens)
    if first is not None:
        chunks.append(text[first:].strip())
    return chunks
