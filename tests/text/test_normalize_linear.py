"""The normalizer runs in linear time (issue 11): upstream's regexes rescan a run of spaces,
dashes, letters or brackets from each of its characters, so a long run took minutes. Ours are
rewritten to enter a run once; these tests check that they give upstream's results (random
differential tests against upstream's own patterns, copied below) and that inputs on which a
rescanning pass needs hours finish within a CPU-time hang guard (no clock is read).
"""

import contextlib
import random
import re
import signal

import pytest

from moss_tts.text import normalize as N
from moss_tts.text.normalize import normalize_delay_text, normalize_tts_text

# Upstream `tts_robust_normalizer_single_script.py` patterns, verbatim (the reference).
_TOK = r"A-Za-z0-9._/+:-"
_PROT = r"___PROT\d+___"
_CJK = r"[\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff]"
_LATINISH = rf"(?:{_PROT}|(?=[{_TOK}]*[A-Za-z])[A-Za-z0-9][{_TOK}]*)"
UPSTREAM_PROTECT = [
    r"https?://[^\s\u3000，。！？；、）】》〉」』]+",
    r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}(?![\w.-])",
    r"(?<![A-Za-z0-9_])@[A-Za-z0-9_]{1,32}",
    r"(?<![A-Za-z0-9_])(?:u|r)/[A-Za-z0-9_]+",
    r"(?<![A-Za-z0-9_])#(?!\s)[^\s#]+",
    r"(?<![A-Za-z0-9_])\.(?=[A-Za-z0-9._-]*[A-Za-z0-9])[A-Za-z0-9._-]+",
    rf"(?<![A-Za-z0-9_])(?=[{_TOK}]*[A-Za-z])(?=[{_TOK}]*[./+:-])[A-Za-z0-9][{_TOK}]*(?![A-Za-z0-9_])",
]
UPSTREAM_SPACES = [
    (r"[ \t\r\f\v]+", " "),
    (rf"({_CJK})\s+(?={_CJK})", r"\1"),
    (rf"({_CJK})\s+(?=\d)", r"\1"),
    (rf"(\d)\s+(?={_CJK})", r"\1"),
    (rf"({_CJK})(?=({_LATINISH}))", r"\1 "),
    (rf"(({_LATINISH}))(?={_CJK})", r"\1 "),
    (r" {2,}", " "),
    (r"\s+([，。！？；：、”’」』】）》])", r"\1"),
    (r"([（【「『《“‘])\s+", r"\1"),
    (r"([，。！？；：、])\s*", r"\1"),
    (r"\s+([,.;!?])", r"\1"),
    (r" {2,}", " "),
]
UPSTREAM_BRACKETS = [
    (r"\[\s*([^\[\]]+?)\s*\]", r'"\1"'),
    (r"\{\s*([^{}]+?)\s*\}", r'"\1"'),
    (r"[【〖『「]\s*([^】〗』」]+?)\s*[】〗』」]", r'"\1"'),
    (r"(^|[。！？!?；;]\s*)《([^》]+)》(?=\s*(?:___PROT\d+___|[—–―-]{2,}|$|[。！？!?；;，,]))",
     r"\1\2"),
]
UPSTREAM_ARROW = r"\s*(?:<[-=]+>|[-=]+>|<[-=]+|[→←↔⇒⇐⇔⟶⟵⟷⟹⟸⟺↦↤↪↩])\s*"
UPSTREAM_DASH_RUN = r"\s*(?:—|–|―|-){2,}\s*"


def upstream_protect(text):
    spans = []

    def park(match):
        spans.append(match.group(0))
        return f"___PROT{len(spans) - 1}___"

    for pattern in UPSTREAM_PROTECT:
        text = re.sub(pattern, park, text)
    return text, spans


def upstream_rules(rules, text):
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text)
    return text


# Pieces that exercise every rule: token characters, separators, spaces (also ones the first
# space rule does not fold), brackets, titles, marks, CJK, e-mail and URL parts, placeholders.
PIECES = list("aZ1_.-/+:%@#uer[]{}【】『」《》<>=→—–。！？!?；;，,中か 　\xa0\u2003\t") + [
    "___PROT0___", "http://", "ab", "x.y", "@b.co", "v2.3", "  ", "--", "->", "...",
]
SAMPLES = 4000


def random_texts(seed, pieces=PIECES):
    rng = random.Random(seed)
    for _ in range(SAMPLES):
        yield "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))


def test_protected_spans_match_upstream_patterns():
    for text in random_texts(1):
        assert N._protect(text) == upstream_protect(text), repr(text)


def test_space_rules_match_upstream_patterns():
    for text in random_texts(2):
        assert N._apply(N._SPACE_RULES, text) == upstream_rules(UPSTREAM_SPACES, text), repr(text)


def test_bracket_rules_match_upstream_patterns():
    for text in random_texts(3):
        assert N._rewrite_brackets(text) == upstream_rules(UPSTREAM_BRACKETS, text), repr(text)


def test_arrow_and_dash_rules_match_upstream_patterns():
    for text in random_texts(4):
        assert N._ARROW.sub("，", text) == re.sub(UPSTREAM_ARROW, "，", text), repr(text)
        assert N._DASH_RUN.sub("。", text) == re.sub(UPSTREAM_DASH_RUN, "。", text), repr(text)


def test_restore_puts_every_span_back_in_one_pass():
    text = "a " + " ".join(f"___PROT{i}___" for i in range(12)) + " ___PROT99___"
    spans = [f"<{i}>" for i in range(12)]
    want = "a " + " ".join(spans) + " ___PROT99___"  # an index with no span stays as it is
    assert N._restore(text, spans) == want


def test_whole_normalizer_matches_upstream_on_random_text():
    """The rewritten passes in the whole pipeline: the same output as with upstream's."""
    for text in random_texts(5):
        assert normalize_tts_text(text) == _normalize_with_upstream_patterns(text), repr(text)


def _normalize_with_upstream_patterns(text):
    text = N._flatten_lines(N._drop_control_chars(text))
    text = re.sub(UPSTREAM_ARROW, "，", text)
    text, spans = upstream_protect(text)
    text = N._underscores_to_spaces(text)
    text = upstream_rules(UPSTREAM_SPACES, text).strip()
    text = upstream_rules(UPSTREAM_BRACKETS, text)
    text = re.sub(UPSTREAM_ARROW, "，", text)
    text = re.sub(UPSTREAM_DASH_RUN, "。", text)
    text = N._apply(N._REPEAT_RULES, text)
    text = N._QE_RUN.sub(N._fold_question_exclaim, text)
    text = upstream_rules(UPSTREAM_SPACES, text).strip()
    for index, span in enumerate(spans):
        text = text.replace(f"___PROT{index}___", span)
    text = text.strip()
    return N._with_terminal_mark(text) if text else text


# --- linear time, without a clock -------------------------------------------------------------
# Each input below is large enough that a pass which rescans a run from each of its characters
# needs minutes to hours on it (the rewritten passes' predecessors: 190 s for the mildest run,
# '%'), while the linear passes need under a second of CPU. No time is measured: a CPU-time
# hang guard only turns such a hang into a failure with a name. It counts this process's own
# CPU time, so a busy machine does not count against it, and it is 20x the linear need.

CPU_GUARD_SECONDS = 20

MIXED = (
    "The quick brown fox jumps over the lazy dog, version v2.3.1 of app.js!! See "
    "https://x.com/a or mail a.b@c.org, @bob #tag. 这是一个测试句子，包含 Anthropic 的 npm "
    "包——以及【重点】和《标题》。\n- item one -> two\n1. 第一步: run `make`...\n"
)
# Runs that took quadratic time before (each was seconds at 10k characters).
RUNS = ["a", "1", "-1", "\u2003", " \xa0", "【", "《。", "[\xa0", "%", "..", "a.a_", "-"]


@contextlib.contextmanager
def cpu_guard(what):
    """Fails the test once this process has used CPU_GUARD_SECONDS of CPU inside the block
    (the regex engine checks for signals as it runs, so a long match is stopped too)."""

    def over(signum, frame):
        pytest.fail(f"normalizing {what} used {CPU_GUARD_SECONDS} CPU seconds: a pass "
                    f"rescans a run (quadratic), where linear passes need under one")
    previous = signal.signal(signal.SIGVTALRM, over)
    signal.setitimer(signal.ITIMER_VIRTUAL, CPU_GUARD_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def test_one_megabyte_normalizes_in_linear_time():
    """Mixed prose with one 50k-character base64-like blob (a single long "word")."""
    blob = "".join(random.Random(0).choice("ABCdef0123+/") for _ in range(50_000))
    text = (MIXED * (950_000 // len(MIXED) + 1))[:950_000] + blob
    with cpu_guard("1 MB of mixed text"):   # ~1 s; before the fix the blob alone took minutes
        assert normalize_tts_text(text).startswith("The quick brown fox")


@pytest.mark.parametrize("run", RUNS, ids=[repr(r) for r in RUNS])
def test_a_long_run_normalizes_in_linear_time(run):
    text = run * (500_000 // len(run))
    with cpu_guard(f"a run of 500,000 characters of {run!r}"):
        normalize_tts_text(text)


def test_titles_that_share_one_end_normalize_in_linear_time():
    """Every 《 after a sentence mark, then one 》 followed by a long space run that is no
    title's end: each opener checked the same run again (the old check: minutes here)."""
    text = "。《" * 100_000 + "x》" + "\xa0" * 100_000 + "y"
    with cpu_guard("100,000 title openers sharing one end"):
        normalize_tts_text(text)


# --- Delay's copy (`normalize_delay_text`) ----------------------------------------------------
# Upstream Delay's two patterns that Nano's copy lacks, verbatim (the reference): its file-like
# token, which must end in a letter or digit, and its structural-bracket rule (run twice).
UPSTREAM_DELAY_FILE_LIKE = (
    rf"(?<![A-Za-z0-9_])(?=[{_TOK}]*[A-Za-z])(?=[{_TOK}]*[._/+:-])"
    rf"[A-Za-z0-9](?:[{_TOK}]*[A-Za-z0-9])?(?![A-Za-z0-9_])"
)
UPSTREAM_DELAY_BRACKETS = [
    (r"(^|[。！？!?；;]\s*)[【〖『「]([^】〗』」]+)[】〗』」]\s*", r"\1\2。"),
    (r"(^|[。！？!?；;]\s*)[【〖『「]([^】〗』」]+)[】〗』」]\s*", r"\1\2。"),
    UPSTREAM_BRACKETS[-1],  # the 《title》 rule, shared with Nano's copy
]
DELAY_PIECES = PIECES + ["〖", "〗", "「", "』", "\n", "[pause 3.2s]", "a_b", "_1", "1.", "。【"]


def test_delay_protected_spans_match_upstream_patterns():
    patterns = UPSTREAM_PROTECT[:-1] + [UPSTREAM_DELAY_FILE_LIKE]
    for text in random_texts(6, DELAY_PIECES):
        spans = []

        def park(match):
            spans.append(match.group(0))
            return f"___PROT{len(spans) - 1}___"

        want = text
        for pattern in patterns:
            want = re.sub(pattern, park, want)
        assert N._protect(text, N.DELAY.protect) == (want, spans), repr(text)


def test_delay_bracket_rules_match_upstream_patterns():
    for text in random_texts(7, DELAY_PIECES):
        assert N._keep_brackets(text) == upstream_rules(UPSTREAM_DELAY_BRACKETS, text), repr(text)


DELAY_RUNS = RUNS + ["。【", "「x", "。「", "a_", "a._", "1.a_"]


@pytest.mark.parametrize("run", DELAY_RUNS, ids=[repr(r) for r in DELAY_RUNS])
def test_a_long_run_normalizes_in_linear_time_with_delays_rules(run):
    text = run * (500_000 // len(run))
    with cpu_guard(f"a run of 500,000 characters of {run!r} (Delay's rules)"):
        normalize_delay_text(text)
