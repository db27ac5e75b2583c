"""MossTTSDelay's copy of the robust normalizer (`normalize_delay_text`, upstream
`moss_tts_delay/tts_robust_normalizer_single_script.py` `normalize_tts_text`): its own case
table, the inline tags it keeps ([S1], [pause 3.2s], {whisper}) through the Delay prompt, and
the rules where it differs from Nano's copy (which `normalize_tts_text` keeps)."""

import pytest

from fixtures.make_delay import make_tokenizer_json, tiny_config
from moss_tts.text.delay_prompts import build_generation_rows
from moss_tts.text.normalize import normalize_delay_text, normalize_tts_text
from moss_tts.text.qwen_tokenizer import QwenTokenizer
from moss_tts.text.template import PromptIds

# The built-in case table of upstream's Delay copy: (name, input, expected); upstream also
# checks that each output is a fixed point.
DELAY_CASES = [
    ("dot_tokens", "别把 .env、.npmrc、.gitignore 提交上去。", "别把 .env、.npmrc、.gitignore 提交上去。"),
    ("version_rc", "3.0.0-rc.1 还不能上生产。", "3.0.0-rc.1 还不能上生产。"),
    ("url", "仓库地址是 https://github.com/instructkr/claude-code",
     "仓库地址是 https://github.com/instructkr/claude-code"),
    ("email", "联系邮箱：ops+tts@example.ai", "联系邮箱：ops+tts@example.ai"),
    ("hashtag_chain", "#张雪峰#张雪峰[话题]#张雪峰事件", "#张雪峰#张雪峰[话题]#张雪峰事件"),
    ("mention_hashtag_boundary", "关注@biscuit0228_并转发#thetime_tbs",
     "关注 @biscuit0228_ 并转发 #thetime_tbs"),
    ("speaker_bracket", "[S1]你好。[S2]收到。", "[S1]你好。[S2]收到。"),
    ("event_bracket", "请模仿 {whisper} 的语气说“别出声”。", "请模仿 {whisper} 的语气说“别出声”。"),
    ("order_bracket", "订单号：[AB-1234-XYZ]", "订单号：[AB-1234-XYZ]"),
    ("struct_headline", "〖重磅〗《新品发布》——现在开始！", "重磅。新品发布。现在开始！"),
    ("struct_notice", "【公告】今天 20:00 维护——预计 30 分钟。", "公告。今天20:00维护。预计30分钟。"),
    ("struct_quote_chain", "『特别提醒』「不要外传」", "特别提醒。不要外传。"),
    ("flow_arrow_chain", "请求接入 -> 身份与策略判定 -> 域服务处理", "请求接入，身份与策略判定，域服务处理"),
    ("flow_arrow_no_space", "A->B", "A，B"),
    ("flow_arrow_unicode", "配置中心→推理编排→运行时执行", "配置中心，推理编排，运行时执行"),
    ("embedded_title", "我喜欢《哈姆雷特》这本书。", "我喜欢《哈姆雷特》这本书。"),
    ("noise_qe", "真的假的？？？！！！", "真的假的？！"),
    ("noise_ellipsis_cn", "【系统提示】请模仿{sad}低沉语气，说“今天下雨了……”",
     "系统提示。请模仿{sad}低沉语气，说“今天下雨了。”"),
    ("chinese_spaces", "这 是\u3000一 段  含有多种空白的文本。", "这是一段含有多种空白的文本。"),
    ("mixed_spaces_2", "今天update到v2.3.1了", "今天 update 到 v2.3.1 了"),
    ("markdown_link", "详情见 [release note](https://github.com/example/release)",
     "详情见 release note https://github.com/example/release"),
    ("list_lines", "- 修复 .map 泄露\n- 发布 v2.3.1", "修复 .map 泄露。发布 v2.3.1"),
    ("numbered_lines", "1. 安装依赖\n2. 运行测试\n3. 发布 v2.3.1", "安装依赖。运行测试。发布 v2.3.1"),
    ("zero_width_url", "详见 https://x.com/\u200bSafety", "详见 https://x.com/Safety"),
]

# Inline pause markers (MOSS-TTS v1.5 model card: "[pause X.Ys]") and other tags stay byte for
# byte: `3.2s` is a protected file-like token, [] and {} are not rewritten by Delay's rules, no
# space rule touches a bracket, and Delay adds no final mark.
CARD_EXAMPLE = "我今天学习了一首中国的古诗，它的名字是[pause 3.2s]静夜思！"
KEPT = [
    CARD_EXAMPLE,
    "Hello there. [pause 1.5s] How are you?",
    "Wait[pause 0.8s]now.",
    "名字是 [pause 3.2s] 静夜思",
    "[S1]Hi there. [S2]Hello! [pause 2s] That is funny [laugh] really.",
    "{whisper} 别出声",
]


@pytest.mark.parametrize("name, text, expected", DELAY_CASES, ids=[c[0] for c in DELAY_CASES])
def test_delay_normalizer_matches_upstream_table(name, text, expected):
    assert normalize_delay_text(text) == expected
    assert normalize_delay_text(expected) == expected


@pytest.mark.parametrize("text", KEPT)
def test_pause_markers_and_tags_survive_delay_normalization(text):
    assert normalize_delay_text(text) == text


# (input, Delay's output, Nano's output), each worked out from the two copies' rules.
DIFFERENCES = [
    # Delay joins lines with 。 whatever they end in (。。 then folds to 。); Nano adds 。 only
    # to a line without a mark, and one at the end of the text
    ("Hi!\nThere", "Hi!。There", "Hi!There。"),
    ("第一行。\n第二行", "第一行。第二行", "第一行。第二行。"),
    # `_` is a separator of Delay's file-like token; Nano turns a free `_` into a space
    ("foo_bar", "foo_bar", "foo bar。"),
    # Delay unwraps a 【】 span in sentence position into a sentence; Nano quotes every span
    ("【公告】今天维护", "公告。今天维护", '"公告"今天维护。'),
    ("[S1]你好", "[S1]你好", '"S1"你好。'),
    ("{whisper} 别出声", "{whisper} 别出声", '"whisper" 别出声。'),
]


@pytest.mark.parametrize("text, delay, nano", DIFFERENCES)
def test_delay_and_nano_copies_differ_where_upstream_does(text, delay, nano):
    assert normalize_delay_text(text) == delay
    assert normalize_tts_text(text) == nano


@pytest.fixture(scope="module")
def tokenizer():
    return QwenTokenizer.from_json(make_tokenizer_json())


CFG = tiny_config()
IDS = PromptIds(CFG["n_vq"], 151644, 151645, 151652, 151653, 151654, 151656,
                     CFG["audio_pad_code"])


@pytest.mark.parametrize("text", KEPT)
def test_delay_prompt_rows_carry_tags_unchanged(tokenizer, text):
    """build_generation_rows normalizes with Delay's rules: the rows equal those of the same
    text given unnormalized, and differ from those of Nano's rewrite (the test can fail)."""
    rows = build_generation_rows(tokenizer, IDS, text, language="Chinese")
    same = build_generation_rows(tokenizer, IDS, text, normalize=False, language="Chinese")
    nano = build_generation_rows(tokenizer, IDS, normalize_tts_text(text), normalize=False,
                                 language="Chinese")
    assert rows.tolist() == same.tolist()
    assert rows.tolist() != nano.tolist()


def test_delay_prompt_normalizes_the_rest_of_the_text(tokenizer):
    rows = build_generation_rows(tokenizer, IDS, "【提示】名字是[pause 3.2s]静夜思……好")
    want = build_generation_rows(tokenizer, IDS, "提示。名字是[pause 3.2s]静夜思。好",
                                 normalize=False)
    assert rows.tolist() == want.tolist()
