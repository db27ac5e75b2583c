"""MOSS-TTSD dialogue text (text/dialogue.py) against upstream `clis/moss_ttsd_app.py`'s rules,
each expected value worked out by hand from the upstream function named in the test."""

import re

import pytest

from moss_tts.errors import InputError
from moss_tts.text.dialogue import (
    MAX_SPEAKERS,
    check_dialogue,
    merge_turns,
    normalize_dialogue,
    prefix_transcripts,
    split_dialogue,
    tag_transcript,
)

# --- normalize_text ---------------------------------------------------------------------------
NORMALIZE = [
    # [n] is shorthand for [Sn]; the turns are joined with nothing between them
    ("[1]你好[2]再见", "[S1]你好[S2]再见"),
    ("[S1] 你好\n[S2] 再见", "[S1]你好[S2]再见"),                      # newline: a space
    # dropped: 【】《》（）『』「」 " - _ “” ～~ ‘’ (the ASCII apostrophe stays)
    ("[S1]“你好”《世界》（测试）『甲』「乙」【丙】好的", "[S1]你好世界测试甲乙丙好的"),
    ("[S2] a well-known snake_case \"word\" ~ok～ ‘it’ isn't", "[S2]a wellknown snakecase word ok it isn't"),
    # laughter: 哈哈+ → [笑], ha(ha)+ as whole words, any case, spaces allowed → [laugh]
    ("[S1]哈哈哈，太好笑了", "[S1][笑]，太好笑了"),
    ("[S1]哈，好", "[S1]哈，好"),                                      # one 哈 stays
    ("[S2]Haha ha, that's funny", "[S2][laugh], that's funny"),
    ("[S2]Ahaha no", "[S2]Ahaha no"),                                  # not a whole word
    # dashes and ellipses → ，
    ("[S1]等等……我想想...好吧—行——对", "[S1]等等，我想想，好吧，行，对"),
    ("[S2]Wait… what⸺no―ok", "[S2]Wait， what，no，ok"),
    # marks inside a sentence: ；：、 → ，  and ; : → ,
    ("[S1]注意：第一；第二、第三", "[S1]注意，第一，第二，第三"),
    ("[S2]Note: one; two", "[S2]Note, one, two"),
    # a run of marks keeps its first (the ellipsis became ， first)
    ("[S1]真的吗？？！！", "[S1]真的吗？"),
    ("[S2]What?!...", "[S2]What?"),
    # the last mark: a final ，/, becomes 。/. and every other 。 a ，
    ("[S1]你好，", "[S1]你好。"),
    ("[S2]Hello,", "[S2]Hello."),
    ("[S1]第一句。第二句。", "[S1]第一句，第二句。"),
    ("[S1]，", "[S1]，"),                                              # one char: kept
    # consecutive turns of one speaker merged (each cleaned first), joined with nothing
    ("[S1]你好。[S1]再见。[S2]嗯。", "[S1]你好。再见。[S2]嗯。"),
    ("[S1] Hi there. [S1] How are you? [S2] Fine.", "[S1]Hi there.How are you?[S2]Fine."),
    ("[S1]a[S2]b[S1]c", "[S1]a[S2]b[S1]c"),
    # words before the first tag, and a turn with no words
    ("Hello [S1]Hi", "Hello[S1]Hi"),
    ("[S1][S2]hi", "[S1][S2]hi"),
    # the TTSD card's example (its start)
    ("[S1] Listen, let's talk business. China. [S2] Well, the pace of innovation there is "
     "extraordinary, honestly. [S1] Extraordinary? I don't like that. ",
     "[S1]Listen, let's talk business. China.[S2]Well, the pace of innovation there is "
     "extraordinary, honestly.[S1]Extraordinary? I don't like that."),
    # inline tags are no speaker turns and stay whole
    ("[S1]名字是[pause 3.2s]静夜思", "[S1]名字是[pause 3.2s]静夜思"),
]


@pytest.mark.parametrize("text, expected", NORMALIZE)
def test_normalize_dialogue_follows_upstream_normalize_text(text, expected):
    assert normalize_dialogue(text) == expected


# --- _merge_consecutive_speaker_tags ----------------------------------------------------------
MERGE = [
    ("[S1] Hello. [S1] World. [S2] Hi.", "[S1]Hello.World.[S2]Hi."),
    ("[S1]a[S2]b[S1]c", "[S1]a[S2]b[S1]c"),
    ("intro [S1] a [S1] b", "intro[S1]ab"),                     # untagged words stay first
    ("[S1] line one\nline two [S1] three", "[S1]line one\nline twothree"),   # newlines kept
    ("[S2]好。 [S2] 再见。", "[S2]好。再见。"),
    ("", ""),
]


@pytest.mark.parametrize("text, expected", MERGE)
def test_merge_turns_follows_upstream_merge_consecutive_speaker_tags(text, expected):
    assert merge_turns(text) == expected


# --- _normalize_prompt_text and _build_prefixed_text ------------------------------------------
@pytest.mark.parametrize("transcript, speaker, expected", [
    ("你好", 2, "[S2] 你好"),
    ("  [S1]hi ", 1, "[S1]hi"),
    ("[S2] hi", 1, "[S1] [S2] hi"),          # another speaker's tag: upstream still prefixes
    ("In short.", 5, "[S5] In short."),
])
def test_tag_transcript_follows_upstream_normalize_prompt_text(transcript, speaker, expected):
    assert tag_transcript(transcript, speaker) == expected


@pytest.mark.parametrize("transcript", ["", "  \n", None])
def test_an_empty_transcript_is_one_line_naming_the_speaker(transcript):
    with pytest.raises(InputError, match="^the transcript of speaker 3 is empty: give the words"):
        tag_transcript(transcript, 3)


def test_prefix_transcripts_follows_upstream_build_prefixed_text():
    """Tagged transcripts in speaker order, then the dialogue; a transcript and a turn of the
    same speaker merge with nothing between them."""
    got = prefix_transcripts("[S2] Well. [S1] Yes.", {2: "[S2] NVIDIA.", 1: "In short."})
    assert got == "[S1]In short.[S2]NVIDIA.Well.[S1]Yes."


# --- _validate_dialogue_text: tags, not voices -------------------------------------------------
@pytest.mark.parametrize("text", ["[S1]hi", "  [S1]hi[S2]yo ", "intro [S3] hi", "[S5] hi",
                                  "[S2] only the second speaker"])
def test_check_dialogue_accepts_any_valid_tags_whoever_has_a_voice(text):
    """A speaker given no voice is the model's choice, whatever its number (upstream's TTSD app
    clones S1 and leaves S2 to the model): no count of voices bounds the tags."""
    assert check_dialogue(text) == text.strip()


@pytest.mark.parametrize("text, message", [
    ("", "text is empty: write the dialogue as [S1] words [S2] words ..."),
    ("  ", "text is empty: write the dialogue as [S1] words [S2] words ..."),
    ("hello there", "the text has no speaker tag: start each turn with its speaker, "
                    "[S1] words [S2] words ..."),
    ("[S6]a", "the text has the speaker tag [S6]: MOSS-TTSD's speaker tags are [S1] to "
              "[S5]; fix the tag"),
    ("[S0]a", "the text has the speaker tag [S0]: MOSS-TTSD's speaker tags are [S1] to [S5]; "
              "fix the tag"),
])
def test_check_dialogue_names_each_problem_and_its_fix_in_one_line(text, message):
    with pytest.raises(InputError) as e:
        check_dialogue(text)
    assert str(e.value) == message
    assert MAX_SPEAKERS == 5


# --- tags outside [S1]..[S5] (issue 31, finding 10) ----------------------------------------------
# Upstream's check finds tags with \[S(\d+)\] and reads them with int(): [S-1] is no tag to it,
# and its cleanup then drops the `-` (words lose `-`), so the turn became [S1]'s; [S01] passes as
# speaker 1 while the model is given "[S01]". Each is refused, naming the tag.
BAD_TAGS = ["[S-1]", "[S0]", "[S6]", "[S01]", "[s1]", "[S 1]", "[ S2]", "[S+2]", "[S10]"]


@pytest.mark.parametrize("tag", BAD_TAGS)
@pytest.mark.parametrize("normalize", [True, False])
def test_a_speaker_tag_outside_s1_to_s5_is_refused_naming_it(tag, normalize):
    from moss_tts.models.delay_tasks import DialogueTTS

    with pytest.raises(InputError) as e:
        DialogueTTS.dialogue(f"[S1] Hello. {tag} Who is this?", normalize=normalize)
    assert str(e.value) == (f"the text has the speaker tag {tag}: MOSS-TTSD's speaker tags are "
                            "[S1] to [S5]; fix the tag")


@pytest.mark.parametrize("text", ["[S1] Hi. [-1] Yo.", "[1] Hi. [0] Yo.", "[S1] Hi. [06] Yo."])
def test_the_cleanups_number_shorthand_outside_1_to_5_is_refused_naming_it(text):
    from moss_tts.models.delay_tasks import DialogueTTS

    with pytest.raises(InputError, match=r"^the text has the speaker tag \[-?0?\d\]: .* \(or "
                                         r"\[1\] to \[5\], which the cleanup reads so\)"):
        DialogueTTS.dialogue(text)
    if text.startswith("[S1]"):     # without the cleanup a bracketed number is words
        assert DialogueTTS.dialogue(text, normalize=False) == text


def test_inline_tags_and_the_accepted_tags_pass():
    from moss_tts.models.delay_tasks import DialogueTTS

    text = "[S1] Hi [laugh] [Sigh] [pause 3.2s]. [S5] Yo [3]. [2] Ok."
    assert DialogueTTS.dialogue(text) == "[S1]Hi [laugh] [Sigh] [pause 3.2s].[S5]Yo[S3].[S2]Ok."
    assert DialogueTTS.dialogue(text, normalize=False) == text


# --- split_dialogue -----------------------------------------------------------------------------
class WordTokenizer:
    """One token per whitespace-separated word: chunk sizes are hand-countable."""

    def encode(self, text):
        return text.split()


class CharTokenizer:
    """One token per non-space character (CJK has no spaces)."""

    def encode(self, text):
        return [c for c in text if not c.isspace()]


WORDS, CHARS = WordTokenizer(), CharTokenizer()


def test_a_dialogue_that_fits_comes_back_unchanged():
    text = "  [S1]你好。 [S2]再见。\n"
    assert split_dialogue(text, CHARS, 200) == [text]
    assert split_dialogue(text, CHARS, 0) == [text]


def test_whole_turns_are_packed_within_the_budget():
    """Turns of 4, 3, 5 and 2 words, budget 8: 4 + 3 fit, + 5 does not; 5 + 2 fit."""
    text = "[S1] One two three. [S2] Four five. [S1] Six seven eight nine. [S2] Ten."
    assert split_dialogue(text, WORDS, 8) == [
        "[S1] One two three. [S2] Four five.", "[S1] Six seven eight nine. [S2] Ten."]
    assert split_dialogue(text, WORDS, 5) == [
        "[S1] One two three.", "[S2] Four five.", "[S1] Six seven eight nine.", "[S2] Ten."]


def test_a_turn_over_the_budget_is_cut_at_sentences_with_its_tag_repeated():
    """Turn 1 is 7 words > 5: its sentences, counted with "[S1] ", are 3, 4 and 2 words; 3 + 4
    share the tag's word (6 > 5), 4 + 2 do (5). The next turn starts a chunk of its own."""
    text = "[S1] Alpha beta. Gamma delta epsilon. Zeta. [S2] Short one."
    assert split_dialogue(text, WORDS, 5) == [
        "[S1] Alpha beta.", "[S1] Gamma delta epsilon. Zeta.", "[S2] Short one."]


def test_chinese_turns_pack_and_a_long_one_is_cut_at_its_comma():
    """Characters: turn 1 is 4 + 14 = 18, turn 2 10, turn 3 8. Budget 30: 18 + 10 fit. Budget
    12: turn 1 is cut at its ， (one sentence of 18 > 12; clauses of 4 + 7 = 11 each), turn 2
    fits alone, 10 + 8 does not."""
    text = "[S1]今天天气很好，我们去公园吧。[S2]好的，走吧。[S1]带上水。"
    assert split_dialogue(text, CHARS, 30) == ["[S1]今天天气很好，我们去公园吧。[S2]好的，走吧。",
                                               "[S1]带上水。"]
    assert split_dialogue(text, CHARS, 12) == [
        "[S1]今天天气很好，", "[S1]我们去公园吧。", "[S2]好的，走吧。", "[S1]带上水。"]


def test_every_chunk_of_a_long_dialogue_starts_with_a_tag_and_keeps_inline_tags(tiny_tokenizer):
    turns = ["[S1] Well, the pace is extraordinary [laugh] honestly. They have the drive.",
             "[S2] 我今天学习了一首中国的古诗，它的名字是[pause 3.2s]静夜思！",
             "[S3] Promising. [pause 1.5s] There it is. I hate that word, a total disaster."]
    text = " ".join(turns * 5)
    longest = max(len(tiny_tokenizer.encode(t)) for t in turns)    # 65 tokens of the tiny BPE
    for budget in (6, 15, 40, longest, 200):
        chunks = split_dialogue(text, tiny_tokenizer, budget)
        assert len(chunks) > 1
        assert all(re.match(r"\[S[123]\]", c) for c in chunks), chunks
        for tag in ("[laugh]", "[pause 3.2s]", "[pause 1.5s]"):
            assert sum(c.count(tag) for c in chunks) == 5, (budget, tag)
        words = re.sub(r"\[S\d\]|\s", "", "".join(chunks))
        assert words == re.sub(r"\[S\d\]|\s", "", text)   # nothing lost, nothing added
        if budget >= 40:   # each piece fits (below that a tag alone may not)
            assert all(len(tiny_tokenizer.encode(c)) <= budget for c in chunks), budget
        if budget >= longest:   # every turn fits whole: chunks are runs of whole turns
            assert " ".join(chunks) == text
