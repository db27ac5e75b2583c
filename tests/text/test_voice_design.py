"""MOSS-VoiceGenerator's input normalization (text/voice_design.py, docs/upstream-notes.md
§family-9.2), each expected value worked out by hand from the rules of its processor's
`normalize_instruction` docstring and mlx-audio's port of the two normalizers."""

import pytest

from moss_tts.text.voice_design import normalize_instruction, normalize_voice_text


@pytest.mark.parametrize("instruction, want", [
    # line break → space; [..] dropped; （ ） → ，; "，," run → its last ","; "!!" → "!"; then
    # Chinese present: every "," → "，"
    ("温柔的女声（轻声）,语速缓慢!!\n带一点笑意[smile]", "温柔的女声，轻声，语速缓慢! 带一点笑意"),
    # no Chinese: the ASCII comma stays; - and _ are decorations in an instruction; ".." → "."
    ("A calm, low voice - warm_and soft..", "A calm, low voice ， warm，and soft."),
    ('She says "hi" {loud}', 'She says "hi"'),          # quotes kept, {..} dropped, stripped
    ("《老人》～疲惫", "，老人，疲惫"),                    # 》～ → "，，", a run cut to one
    ("", ""),
])
def test_instruction_rules(instruction, want):
    assert normalize_instruction(instruction) == want


@pytest.mark.parametrize("text, want", [
    ('他说："你好！！"【笑】[laugh]\n再见。。', "他说：你好，笑， 再见。"),   # "！！，" → "，"
    # quotes dropped; 【】 → ，; "!!" → "!"; the run "，." → its last "."
    ('Hello there!! "Good morning"【笑】.', "Hello there! Good morning，笑."),
    ("well - done_now", "well - done_now"),              # - and _ stay in a text
    ("Hi, 你好,世界", "Hi, 你好,世界"),                  # no comma rule for the text
    ("  {x}  ", ""),
])
def test_text_rules(text, want):
    assert normalize_voice_text(text) == want


def test_none_and_empty_pass_through():
    assert normalize_voice_text("") == "" and normalize_instruction("") == ""
