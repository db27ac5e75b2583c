"""Text normalization before tokenization (docs/upstream-notes.md §nano-7, §family-7.1).

`normalize_tts_text` is the robust, non-semantic cleanup of upstream MOSS-TTS-Nano
`tts_robust_normalizer_single_script.py`; `normalize_delay_text` is MossTTSDelay's older copy of
it (`moss_tts_delay/tts_robust_normalizer_single_script.py`), which keeps `[...]` / `{...}`
(speaker tags, `[pause 3.2s]`, sound events); one implementation runs both (`NANO`, `DELAY`).
`prepare_texts` is the stage order of upstream `text_normalization_pipeline.py`
`prepare_tts_request_texts`. WeText (semantic number/date expansion) needs pynini and is not a
dependency: callers may plug one in as `wetext=`.
"""

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from moss_tts.text.script import CJK_CLASS, CLOSERS

_CJK = f"[{CJK_CLASS}]"
_CJK_IDEOGRAPH = re.compile("[\u3400-\u9fff]")

# Protected spans are swapped for numbered placeholders so later rules cannot touch them.
_PLACEHOLDER = r"___PROT\d+___"
_PLACEHOLDER_RE = re.compile(_PLACEHOLDER)
_PLACEHOLDER_INDEX = re.compile(r"___PROT(\d+)___")
_TOKEN_CHARS = r"A-Za-z0-9._/+:-"  # characters of file names, versions and paths
# A Latin-ish token: a placeholder, or a file/version-like run that contains a letter.
_LATINISH = rf"(?:{_PLACEHOLDER}|(?=[{_TOKEN_CHARS}]*[A-Za-z])[A-Za-z0-9][{_TOKEN_CHARS}]*)"

# Upstream's protection patterns, written so the regex engine never rescans a run: each rule is
# (pattern, pick) where pick(match) is the part to protect (None: leave the match as it is). A
# run that upstream's pattern would try again from every later start fails there too, so it is
# consumed at once and left unchanged (upstream's form scans a run once per start: quadratic).
_SEPARATOR = re.compile(r"[./+:-]")
_LETTER = re.compile(r"[A-Za-z]")


def _whole(match):
    return match[0]


def _named_part(match):
    return match["p"]


def _file_like(match):
    """A token run holding a letter and a separator (upstream's two lookaheads)."""
    run = match[0]
    return run if _LETTER.search(run) and _SEPARATOR.search(run) else None


# Order matters: URLs before e-mails before @mentions, file-like tokens last.
_PROTECTED_PATTERNS = tuple(
    (re.compile(p), pick)
    for p, pick in (
        # URL, up to whitespace or CJK punctuation
        (r"https?://[^\s\u3000，。！？；、）】》〉」』]+", _whole),
        (  # e-mail; upstream: (?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}(?![\w.-])
            r"(?<![\w.+-])(?:(?P<p>[A-Za-z0-9._%+-]++@[A-Za-z0-9.-]+\.[A-Za-z]{2,}(?![\w.-]))"
            r"|[A-Za-z0-9._%+-]++)",
            _named_part,
        ),
        (r"(?<![A-Za-z0-9_])@[A-Za-z0-9_]{1,32}", _whole),  # @mention
        (r"(?<![A-Za-z0-9_])[ur]/[A-Za-z0-9_]+", _whole),  # reddit u/name, r/name
        (r"(?<![A-Za-z0-9_])#(?!\s)[^\s#]+", _whole),  # #hashtag
        (  # .env, .map; upstream: (?<![A-Za-z0-9_])\.(?=[A-Za-z0-9._-]*[A-Za-z0-9])[A-Za-z0-9._-]+
            r"(?<![A-Za-z0-9_])(?:(?P<p>\.(?=[._-]*+[A-Za-z0-9])[A-Za-z0-9._-]+)|\.[._-]*+)",
            _named_part,
        ),
        # app.js.map, v2.3.1, a/b-c.py: must hold a letter and one of . / + : - (plain
        # snake_case is not protected, so its `_` still becomes a space). Upstream:
        # (?<![A-Za-z0-9_])(?=[TOK]*[A-Za-z])(?=[TOK]*[./+:-])[A-Za-z0-9][TOK]*(?![A-Za-z0-9_]);
        # its final lookahead always holds, as `_` is a token character.
        (rf"(?<![A-Za-z0-9_])[A-Za-z0-9][{_TOKEN_CHARS}]*+", _file_like),
    )
)
_DELAY_SEPARATOR = re.compile(r"[._/+:-]")  # Delay's file-like lookahead also counts `_`


def _file_like_to_alnum(match):
    """Delay's file-like token: the run must hold a letter and one of . _ / + : -, and the
    token ends at the run's last letter or digit that no letter, digit or `_` follows.
    Upstream: (?<![A-Za-z0-9_])(?=[TOK]*[A-Za-z])(?=[TOK]*[._/+:-])
    [A-Za-z0-9](?:[TOK]*[A-Za-z0-9])?(?![A-Za-z0-9_]). A start that fails fails for every
    later start in the run as well (their runs are suffixes), so the run is consumed."""
    run = match[0]
    if not (_LETTER.search(run) and _DELAY_SEPARATOR.search(run)):
        return None
    if run[-1].isalnum():  # the run is ASCII token characters
        return run
    for i in range(len(run) - 1, 0, -1):
        if run[i] in "./+:-" and run[i - 1].isalnum():
            return run[:i]
    return None


# Delay protects the same spans, but a file-like token must end in a letter or digit.
_DELAY_PROTECTED_PATTERNS = _PROTECTED_PATTERNS[:-1] + (
    (_PROTECTED_PATTERNS[-1][0], _file_like_to_alnum),
)

_MARKDOWN_LINK = re.compile(r"\[([^\[\]]+?)\]\((https?://[^)\s]+)\)")
# Line prefixes removed in this order: heading, quote, bullet, ordered-list number.
_LINE_PREFIXES = tuple(
    re.compile(p) for p in (r"^#{1,6}\s+", r"^>\s+", r"^[-*+]\s+", r"^\d+[.)]\s+")
)
# Runs of spaces and dashes are entered only at their first character (the lookbehinds): a
# later start in the same run fails as the first did, and upstream's `\s*(?:...)` retries each.
_ARROW = re.compile(
    r"(?:(?<!\s)\s+)?(?:<[-=]+>|(?<![-=])[-=]+>|<[-=]+|[→←↔⇒⇐⇔⟶⟵⟷⟹⟸⟺↦↤↪↩])\s*"
)

# A whole token run right before CJK. Upstream's ({_LATINISH})(?={_CJK}) rescans the run from
# each of its characters; it matches exactly when the run holds a letter (a placeholder does).
_LATIN_BEFORE_CJK = rf"(?<![{_TOKEN_CHARS}])[{_TOKEN_CHARS}]++(?={_CJK})"


def _space_after_latinish(match):
    """One space between a Latin-ish token (a run with a letter) and the CJK after it."""
    token = match[0]
    return token + " " if _LETTER.search(token) else token


# (pattern, replacement) passes of the space rules, applied in order.
_SPACE_RULES = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"[ \t\r\f\v]+", " "),
        (rf"({_CJK})\s+(?={_CJK})", r"\1"),  # no spaces inside CJK runs
        (rf"({_CJK})\s+(?=\d)", r"\1"),  # nor between CJK and digits
        (rf"(\d)\s+(?={_CJK})", r"\1"),
        (rf"({_CJK})(?={_LATINISH})", r"\1 "),  # one space between CJK and Latin-ish tokens
        (_LATIN_BEFORE_CJK, _space_after_latinish),
        (r" {2,}", " "),
        # none before Chinese closing punctuation
        (r"(?<!\s)\s+([，。！？；：、”’」』】）》])", r"\1"),
        (r"([（【「『《“‘])\s+", r"\1"),  # none after Chinese opening brackets
        (r"([，。！？；：、])\s*", r"\1"),  # none after Chinese punctuation
        (r"(?<!\s)\s+([,.;!?])", r"\1"),  # none before ASCII punctuation
        (r" {2,}", " "),
    )
)

# Bracketed spans become quoted: (openers, closers, chars the content cannot hold), as upstream's
# OPEN\s*([^STOPS]+?)\s*CLOSE rules, which rescan to the next closer from every opener.
_QUOTED_SPANS = (("[", "]", "[]"), ("{", "}", "{}"), ("【〖『「", "】〗』」", "】〗』」"))
_TITLE_MARKS = frozenset("。！？!?；;")
# Delay: a 【】〖〗『』「」 span at the start or after a sentence end becomes a sentence
_STRUCTURAL_OPEN = re.compile("[【〖『「]")
_STRUCTURAL_CLOSE = re.compile("[】〗』」]")
# What may follow a stand-alone 《title》: the end, a protected span, a dash run or punctuation.
_TITLE_TAIL = re.compile(rf"\s*(?:{_PLACEHOLDER}|[—–―-]{{2,}}|$|[。！？!?；;，,])")
_DASH_RUN = re.compile(r"(?:(?<!\s)\s+)?[—–―-]{2,}\s*")

_REPEAT_RULES = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"\.{3,}|…{2,}", "。"),  # ellipses; a single … is kept
        (r"[。．]{2,}", "。"),
        (r"[，,]{2,}", "，"),
        (r"[!！]{2,}", "！"),
        (r"[?？]{2,}", "？"),
    )
)
_QE_RUN = re.compile(r"[!?！？]{2,}")

# zh WeText hyphen guard: a kept hyphen is parked behind a marker while the others are rewritten.
_KEEP_HYPHEN = "\x00KEEP_HYPHEN\x00"
_NEGATIVE_OR_RANGE = tuple(
    re.compile(p)
    for p in (
        r"(^\s*)-\s*(?=\d)",  # -2 at the start
        r"([=:+*/,(，:：；;（【\[{])\s*-\s*(?=\d)",  # x=-2, (-2)
        r"([\u3400-\u9fff])\s*-\s*(?=\d)",  # 为-2
        r"(\d)\s*-\s*(?=\d)",  # 10-3, 2024-05-01
    )
)
_CJK_HYPHEN_CJK = re.compile(r"([\u3400-\u9fff])\s*-\s*(?=[\u3400-\u9fff])")
_OTHER_HYPHEN = re.compile(r"([^\s-])\s*-\s*(?=[^\s-])")

ENGLISH_VOICES = frozenset({"Trump", "Ava", "Bella", "Adam", "Nathan"})


def _apply(rules, text):
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


def _drop_control_chars(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u3000", " ")
    # Category C covers the zero-width chars (U+200B-U+200D, U+FEFF are Cf) too.
    return "".join(ch for ch in text if ch in "\n\t " or unicodedata.category(ch)[0] != "C")


def _with_terminal_mark(line):
    """`line` + `。` unless its last visible char (closing quotes skipped) is punctuation."""
    i = len(line) - 1
    while i >= 0 and line[i].isspace():
        i -= 1
    while i >= 0 and line[i] in CLOSERS:
        i -= 1
    if i >= 0 and unicodedata.category(line[i])[0] == "P":
        return line
    return line + "。"


def _flatten_lines(text, join_with_mark=False):
    """Strip Markdown line prefixes and join the lines, each ending in punctuation (Nano), or
    with `。` between every two (Delay: join_with_mark)."""
    text = _MARKDOWN_LINK.sub(r"\1 \2", text)
    lines = []
    for raw in text.splitlines():  # str.splitlines also splits on U+2028 / U+2029
        line = raw.strip()
        if line:
            lines.append(_apply(((p, "") for p in _LINE_PREFIXES), line))
    if join_with_mark:
        return "。".join(lines)
    return "".join(_with_terminal_mark(line) for line in lines[:-1]) + (lines[-1] if lines else "")


def _protect(text, patterns=_PROTECTED_PATTERNS):
    spans = []

    for pattern, pick in patterns:

        def park(match, pick=pick):
            span = pick(match)
            if span is None:
                return match[0]
            spans.append(span)
            return f"___PROT{len(spans) - 1}___" + match[0][len(span):]

        text = pattern.sub(park, text)
    return text, spans


def _restore(text, spans):
    """Placeholders back to their spans in one pass (one `replace` per span is quadratic)."""

    def span(match):
        index = int(match[1])
        return spans[index] if index < len(spans) else match[0]

    return _PLACEHOLDER_INDEX.sub(span, text)


def _underscores_to_spaces(text):
    pieces = re.split(f"({_PLACEHOLDER})", text)
    return "".join(p if _PLACEHOLDER_RE.fullmatch(p) else p.replace("_", " ") for p in pieces)


def _quote_spans(text, openers, closers, stops):
    """Each OPEN content CLOSE span as "content" (stripped; all-space content keeps its last
    char, as the regex does), scanning every character once."""
    find_open = re.compile(f"[{re.escape(openers)}]")
    find_stop = re.compile(f"[{re.escape(stops)}]")
    out, done, at = [], 0, 0
    while (opener := find_open.search(text, at)) is not None:
        start = opener.start()
        stop = find_stop.search(text, start + 1)
        if stop is None:  # no closer after this opener, so none after a later one either
            break
        end, at = stop.start(), start + 1
        if text[end] in closers and end > start + 1:
            content = text[start + 1 : end]
            out += [text[done:start], '"', content.strip() or content[-1], '"']
            done = at = end + 1
    return "".join(out) + text[done:]


def _opens_title(text, at, done):
    """Upstream's `(^|[。！？!?；;]\\s*)` before the 《 at `at`, not reaching into the last match."""
    if at == 0:
        return True
    i = at - 1
    while i >= done and text[i].isspace():
        i -= 1
    return i >= done and text[i] in _TITLE_MARKS


def _unwrap_titles(text):
    """A stand-alone 《title》 (at the start or after a sentence end, followed by `_TITLE_TAIL`)
    loses its brackets; embedded titles stay. The first 》 after an opener serves every opener
    before it, so it is searched once, and what follows it is checked once."""
    out, done, at, close = [], 0, 0, -1
    while (start := text.find("《", at)) >= 0:
        if close <= start:
            close = text.find("》", start + 1)
            if close < 0:
                break
        at = start + 1
        if close == at or not _opens_title(text, start, done):
            continue
        if _TITLE_TAIL.match(text, close + 1):
            out += [text[done:start], text[at:close]]
            done = close + 1
        at = close + 1  # matched, or every opener up to this 》 fails on what follows it
    return "".join(out) + text[done:]


def _rewrite_brackets(text):
    """Nano: every bracketed span quoted, then stand-alone titles unwrapped."""
    for openers, closers, stops in _QUOTED_SPANS:
        text = _quote_spans(text, openers, closers, stops)
    return _unwrap_titles(text)


def _unwrap_structural(text):
    """One pass of Delay's (^|[。！？!?；;]\\s*)[【〖『「]([^】〗』」]+)[】〗』」]\\s* → \\1\\2。: a
    bracketed span at the start or after a sentence end becomes its content and a `。`. The
    first closer after an opener serves every opener before it, so it is searched once."""
    out, done, at, close = [], 0, 0, -1
    while (opener := _STRUCTURAL_OPEN.search(text, at)) is not None:
        start = opener.start()
        if close <= start:
            found = _STRUCTURAL_CLOSE.search(text, start + 1)
            if found is None:  # no closer after this opener, so none after a later one either
                break
            close = found.start()
        at = start + 1
        if close == at or not _opens_title(text, start, done):
            continue
        end = close + 1
        while end < len(text) and text[end].isspace():
            end += 1
        out += [text[done:start], text[at:close], "。"]
        done = at = end
    return "".join(out) + text[done:]


def _keep_brackets(text):
    """Delay: `[...]` and `{...}` stay as they are; 【】〖〗『』「」 spans in sentence position
    become sentences (two passes, as upstream: a pass cannot see the `。` it just wrote), then
    stand-alone titles are unwrapped."""
    return _unwrap_titles(_unwrap_structural(_unwrap_structural(text)))


def _fold_question_exclaim(match):
    run = match.group(0)
    question, exclaim = any(c in "?？" for c in run), any(c in "!！" for c in run)
    return "？！" if question and exclaim else ("？" if question else "！")


@dataclass(frozen=True)
class NormalizerRules:
    """Where upstream's two copies of the cleaner differ; every other rule is shared."""

    join_with_mark: bool  # lines joined by `。` (Delay), or each closed by a mark if it lacks one
    early_arrows: bool  # arrows → `，` before the spans are protected too (Nano)
    underscores: bool  # `_` outside protected spans → space (Nano)
    protect: tuple  # the protected-span patterns (Delay's file-like token ends in a letter/digit)
    brackets: Callable[[str], str]  # Nano quotes every bracketed span, Delay keeps [] and {}
    terminal_mark: bool  # a `。` closes a text whose last visible char is no punctuation (Nano)


NANO = NormalizerRules(False, True, True, _PROTECTED_PATTERNS, _rewrite_brackets, True)
DELAY = NormalizerRules(True, False, False, _DELAY_PROTECTED_PATTERNS, _keep_brackets, False)


def normalize_tts_text(text, rules=NANO):
    """Robust, non-semantic TTS text cleanup (no number/date expansion); idempotent.

    >>> normalize_tts_text("这是Anthropic的npm包")
    '这是 Anthropic 的 npm 包。'
    """
    text = _flatten_lines(_drop_control_chars(text), rules.join_with_mark)
    if rules.early_arrows:
        text = _ARROW.sub("，", text)
    text, spans = _protect(text, rules.protect)
    if rules.underscores:
        text = _underscores_to_spaces(text)
    text = _apply(_SPACE_RULES, text).strip()
    text = rules.brackets(text)
    text = _ARROW.sub("，", text)  # Nano: again, as protected spans are placeholders now
    text = _DASH_RUN.sub("。", text)
    text = _apply(_REPEAT_RULES, text)
    text = _QE_RUN.sub(_fold_question_exclaim, text)
    text = _apply(_SPACE_RULES, text).strip()
    text = _restore(text, spans).strip()
    # Lines were joined above, so the text is one line: one terminal mark at the end.
    return _with_terminal_mark(text) if text and rules.terminal_mark else text


def normalize_delay_text(text):
    """MossTTSDelay's cleanup: `normalize_tts_text` with upstream Delay's rules, which keep
    `[S1]`, `[pause 3.2s]` and `{sound events}` untouched and add no final mark.

    >>> normalize_delay_text("它的名字是[pause 3.2s]静夜思")
    '它的名字是[pause 3.2s]静夜思'
    """
    return normalize_tts_text(text, DELAY)


def resolve_wetext_language(text, voice=""):
    """`zh` for any CJK ideograph, else `en` for any ASCII letter or an English preset voice."""
    if _CJK_IDEOGRAPH.search(text):
        return "zh"
    if re.search(r"[A-Za-z]", text) or voice in ENGLISH_VOICES:
        return "en"
    return "zh"  # kana-only or Hangul text goes to the zh normalizer, as upstream


def guard_zh_hyphens(text):
    """Rewrite hyphens before zh WeText so it does not read them as 减 (minus).

    Minus signs and numeric ranges stay; CJK-CJK becomes `，`; any other hyphen becomes a space.
    """
    if "-" not in text:
        return text
    for pattern in _NEGATIVE_OR_RANGE:
        text = pattern.sub(rf"\1{_KEEP_HYPHEN}", text)
    text = _CJK_HYPHEN_CJK.sub(r"\1，", text)
    text = _OTHER_HYPHEN.sub(r"\1 ", text)
    return re.sub(r" {2,}", " ", text).strip().replace(_KEEP_HYPHEN, "-")


@dataclass(frozen=True)
class PreparedTexts:
    text: str
    prompt_text: str | None  # None when absent or empty after normalization (as infer.py)
    stages: tuple  # e.g. ("robust",) or ("robust_pre", "wetext:zh", "robust_post")
    language: str  # WeText language, "" when WeText did not run


def prepare_texts(text, prompt_text=None, *, robust=True, wetext=None, voice=""):
    """Normalize the target text and the optional prompt text the same way.

    Stage order: robust → (zh: hyphen guard) → wetext → robust again when both are on; robust
    once, or (guard →) wetext once, when only one is on. `wetext(text, language) -> str` is an
    optional semantic normalizer (WeText); `language` is "zh" or "en".

    Upstream defaults: `infer.py` and `moss-tts-nano generate` (PyTorch) run robust + WeText;
    `generate --backend onnx` runs robust only. Our default (robust only, no WeText) therefore
    equals the upstream ONNX CLI and differs from its PyTorch CLI only in number/date reading.
    """
    prompt_text = prompt_text or ""
    stages, language = [], ""
    if robust and wetext is not None:
        text = normalize_tts_text(text)
        prompt_text = normalize_tts_text(prompt_text) if prompt_text else ""
        stages.append("robust_pre")
    if wetext is not None:
        language = resolve_wetext_language(text, voice)
        if language == "zh":
            text, prompt_text = guard_zh_hyphens(text), guard_zh_hyphens(prompt_text)
        text = wetext(text, language) if text else ""
        prompt_text = wetext(prompt_text, language) if prompt_text else ""
        stages.append(f"wetext:{language}")
    if robust:
        text = normalize_tts_text(text)
        prompt_text = normalize_tts_text(prompt_text) if prompt_text else ""
        stages.append("robust_post" if wetext is not None else "robust")
    return PreparedTexts(text, prompt_text.strip() or None, tuple(stages), language)
