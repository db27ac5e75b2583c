import re

import pytest

from moss_tts.errors import InputError
from moss_tts.text import chunking, normalize
from moss_tts.models.long_text import split_long_text
from moss_tts.text.chunking import pause_after, pause_samples, split_into_chunks
from moss_tts.text.script import SENTENCE_END


class WordTokenizer:
    """One token per whitespace word and per CJK character: chunk boundaries are hand-derivable."""

    def encode(self, text):
        return re.findall(r"[\u4e00-\u9fff]|[^\s\u4e00-\u9fff]+", text)


class CharTokenizer:
    """One token per non-space character."""

    def encode(self, text):
        return [c for c in text if not c.isspace()]


WORDS = WordTokenizer()
CHARS = CharTokenizer()


@pytest.mark.parametrize(
    "budget, expected",
    [
        (5, ["The cat sat.", "The dog ran far away.", "Birds sing."]),
        (8, ["The cat sat. The dog ran far away.", "Birds sing."]),
    ],
)
def test_english_sentences_pack_greedily_within_the_budget(budget, expected):
    text = "The cat sat. The dog ran far away. Birds sing."
    assert split_into_chunks(text, WORDS, budget) == expected


def test_cjk_sentences_join_without_space_and_get_a_final_mark():
    text = "今天天气很好。我们去公园吧！好的"
    assert split_into_chunks(text, WORDS, 8) == ["今天天气很好。", "我们去公园吧！", "好的。"]
    assert split_into_chunks(text, WORDS, 14) == ["今天天气很好。我们去公园吧！", "好的。"]


def test_long_sentence_is_cut_at_clause_marks_of_the_prepared_text():
    text = "one two three, four five six, seven eight nine."
    # More than one chunk: the prepared text (first letter upper-cased) is what gets split.
    assert split_into_chunks(text, WORDS, 4) == [
        "One two three,",
        "four five six,",
        "seven eight nine.",
    ]


def test_closing_quotes_stay_with_their_sentence():
    text = 'He said "stop." Then left.'
    assert split_into_chunks(text, WORDS, 3) == ['He said "stop."', "Then left."]


def test_closers_are_one_table_with_the_normalizer():
    """The chunker and the normalizer share one closer table (upstream's chunker lacked 〉)."""
    text = "他说〈好的。〉然后走了。"
    assert split_into_chunks(text, WORDS, 6) == ["他说〈好的。〉", "然后走了。"]
    assert chunking.CLOSERS is normalize.CLOSERS


def test_single_overlong_sentence_is_cut_by_token_budget_at_spaces():
    text = "alpha beta gamma delta epsilon zeta eta theta"
    assert split_into_chunks(text, WORDS, 3) == [
        "Alpha beta gamma",
        "delta epsilon zeta",
        "eta theta.",
    ]


@pytest.mark.parametrize("n_x, cut_at_space", [(7, True), (6, False)])
def test_token_cut_backs_off_to_a_space_only_within_24_chars(n_x, cut_at_space):
    # 30-token budget: the longest prefix is 31 chars (x's, a space, y's); upstream scans the
    # last 24 of them for a boundary, so a space at index 7 is found and one at index 6 is not.
    text = "x" * n_x + " " + "y" * 40
    chunks = split_into_chunks(text, CHARS, 30)
    if cut_at_space:
        assert chunks[0] == "X" + "x" * (n_x - 1)
    else:
        assert chunks[0] == "X" + "x" * (n_x - 1) + " " + "y" * (30 - n_x)
    assert "".join(chunks).replace(" ", "") == ("X" + "x" * (n_x - 1) + "y" * 40 + ".")
    assert all(len(CHARS.encode(c)) <= 30 for c in chunks)


@pytest.mark.parametrize("budget", [0, -5])
def test_budget_of_zero_or_less_disables_chunking(budget):
    text = "  first line.\nSecond line!  " + "word " * 200
    assert split_into_chunks(text, WORDS, budget) == [text]


@pytest.mark.parametrize("text", ["hello world", "你好", "  lower case, no mark  "])
def test_one_chunk_returns_the_original_text(text):
    assert split_into_chunks(text, WORDS, 75) == [text]


@pytest.mark.parametrize("text", ["", "   \n "])
def test_empty_text_raises_input_error(text):
    with pytest.raises(InputError, match="text is empty"):
        split_into_chunks(text, WORDS, 75)


def test_tiny_spm_chunks_respect_the_budget_and_keep_every_character(tiny_tokenizer):
    text = (
        "The speaker reads a short sentence in the morning. 今天天气很好，我们一起去公园。"
        "Every student clones the long story with a calm voice, again and again, near the river! "
        "ni hao shi jie jin tian tian qi hen hao wo men yi qi qu gong yuan xie xie zai jian"
    )
    budget = 20
    chunks = split_into_chunks(text, tiny_tokenizer, budget)
    assert len(chunks) > 2
    assert all(len(tiny_tokenizer.encode(c)) <= budget for c in chunks)
    assert "".join(chunks).replace(" ", "") == text.replace(" ", "") + "。"


@pytest.mark.parametrize(
    "chunk, seconds",
    [
        ("Hello there.", 0.40),
        ("one two three four", 0.40),
        ("one two three four five", 0.24),
        ("今天天气很好我们一起去公园吧这是一个很长的句子。", 0.40),  # no spaces: one "word"
        ("今天 天气 很好 我们 一起", 0.24),
    ],
)
def test_pause_after_depends_on_whitespace_word_count(chunk, seconds):
    assert pause_after(chunk) == seconds


def test_pause_samples_round_at_48k():
    assert pause_samples("a b c d e f", 48000) == 11520
    assert pause_samples("hi", 48000) == 19200


class CountingTokenizer:
    """A tokenizer that counts the characters it is asked to encode: the work of a cut search,
    the same on every machine however busy."""

    def __init__(self, tokenizer):
        self.tokenizer, self.characters = tokenizer, 0

    def encode(self, text):
        self.characters += len(text)
        return self.tokenizer.encode(text)


def test_unpunctuated_text_is_cut_in_linear_time(tiny_tokenizer):
    """Each token-budget cut searches a window near its own length, not the whole rest."""
    words = "ni hao shi jie jin tian tian qi hen hao wo men yi qi qu gong yuan "

    def characters_encoded(n):
        text = (words * (n // len(words) + 1))[:n]
        counting = CountingTokenizer(tiny_tokenizer)
        chunks = split_into_chunks(text, counting, 75)
        assert all(len(tiny_tokenizer.encode(c)) <= 75 for c in chunks)
        return counting.characters

    small, large = characters_encoded(10_000), characters_encoded(40_000)
    # 4x the text: linear is 4x the characters encoded, 5 % allowed for the ends (a cut's
    # windows and the packing's recounts each cover about the cut's own text, a few times
    # over); before, each cut binary-searched the whole rest (about 14x). The count is exact.
    assert large <= 4.2 * small, f"{small} characters encoded → {large}"
    assert small <= 20 * 10_000, f"{small} characters encoded for 10,000"


# --- tags kept whole (keep_tags; the Delay family's long text) ------------------------------

def test_a_pause_marker_is_no_sentence_end_with_keep_tags():
    """`[pause 1.5s]` holds a '.' and a space: with keep_tags neither cuts. By hand (WORDS):
    sentences "Hello there." (2), "[pause 1.5s] How are you today?" (6 > 4: no clause mark, so
    the budget cut at the space after "are"), "Fine." (1); packed within 4."""
    text = "Hello there. [pause 1.5s] How are you today? Fine."
    assert split_into_chunks(text, WORDS, 4, keep_tags=True) == [
        "Hello there.", "[pause 1.5s] How are", "you today? Fine."]
    # without keep_tags (Nano's upstream) the '.' inside the marker ends a sentence
    assert split_into_chunks(text, WORDS, 4) == [
        "Hello there. [pause 1.", "5s] How are you", "today? Fine."]


def test_a_budget_cut_inside_a_tag_moves_to_its_edge():
    """CHARS, budget 5: "Ab" is cut at its space; then the longest prefix "[paus" ends inside
    the tag, which starts the piece, so the cut moves to the tag's end (a tag longer than the
    budget stays whole)."""
    text = "Ab [pause 1.5s] cd."
    assert split_into_chunks(text, CHARS, 5, keep_tags=True) == ["Ab", "[pause 1.5s]", "cd."]
    assert split_into_chunks(text, CHARS, 5) == ["Ab", "[paus", "e 1.", "5s]", "cd."]


def test_the_model_cards_pause_example_is_cut_only_at_its_comma():
    """MOSS-TTS v1.5 card: 13 + 1 + 5 + 2 + 3 + 1 = 25 WORDS tokens, budget 14: one sentence
    (the '.' of 3.2s is inside the tag), cut at its clause mark into 14 and 11 tokens."""
    text = "我今天学习了一首中国的古诗，它的名字是[pause 3.2s]静夜思！"
    chunks = split_long_text(text, WORDS, 14)
    assert chunks == ["我今天学习了一首中国的古诗，", "它的名字是[pause 3.2s]静夜思！"]
    assert "".join(chunks) == text
    assert chunking.split_at_marks(text, SENTENCE_END, keep_tags=True) == [text]
    assert chunking.split_at_marks(text, SENTENCE_END) == [
        "我今天学习了一首中国的古诗，它的名字是[pause 3.", "2s]静夜思！"]   # Nano's rules


def test_long_text_never_cuts_inside_a_tag(tiny_tokenizer):
    """split_long_text (Delay, Local, Local v1.5) on a long text full of tags, small budgets:
    every tag is found whole in one chunk, as many times as it was given."""
    sentence = ("The speaker reads [pause 1.5s] a short line, then {sigh} waits; [S2] answers "
                "[pause 0.25s] slowly. 今天天气很好，[pause 3.2s]我们去公园。")
    text = sentence * 6
    tags = ["[pause 1.5s]", "{sigh}", "[S2]", "[pause 0.25s]", "[pause 3.2s]"]
    for budget in (4, 7, 12, 30):
        chunks = split_long_text(text, tiny_tokenizer, budget)
        assert len(chunks) > 1
        for tag in tags:
            assert sum(c.count(tag) for c in chunks) == 6, (budget, tag)
        assert "".join(chunks).replace(" ", "") == text.replace(" ", "")
