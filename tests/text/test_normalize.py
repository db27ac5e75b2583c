import pytest

from moss_tts.text.normalize import (
    guard_zh_hyphens,
    normalize_tts_text,
    prepare_texts,
    resolve_wetext_language,
)

# The built-in case table of upstream `tts_robust_normalizer_single_script.py`:
# (name, input, expected). Upstream also checks that each output is a fixed point.
ROBUST_CASES = [
    (
        "dot_map_sentence",
        "2026 年 3 月 31 日，安全研究员 Chaofan Shou (@Fried_rice) 发现 Anthropic 的 npm 包中暴露了 .map 文件，",
        "2026年3月31日，安全研究员 Chaofan Shou (@Fried_rice) 发现 Anthropic 的 npm 包中暴露了 .map 文件，",
    ),
    (
        "dot_tokens",
        "别把 .env、.npmrc、.gitignore 提交上去。",
        "别把 .env、.npmrc、.gitignore 提交上去。",
    ),
    (
        "file_names",
        "请检查 bundle.min.js、package.json 和 processing_moss_tts.py。",
        "请检查 bundle.min.js、package.json 和 processing_moss_tts.py。",
    ),
    ("index_d_ts", "index.d.ts 里也有同样的问题。", "index.d.ts 里也有同样的问题。"),
    (
        "version_build",
        "Bug 的讨论可以精确到 v2.3.1 (Build 15)。",
        "Bug 的讨论可以精确到 v2.3.1 (Build 15)。",
    ),
    ("version_rc", "3.0.0-rc.1 还不能上生产。", "3.0.0-rc.1 还不能上生产。"),
    (
        "jar_name",
        "fabric-api-0.91.3+1.20.2.jar 需要单独下载。",
        "fabric-api-0.91.3+1.20.2.jar 需要单独下载。",
    ),
    (
        "url",
        "仓库地址是 https://github.com/instructkr/claude-code",
        "仓库地址是 https://github.com/instructkr/claude-code。",
    ),
    ("email", "联系邮箱：ops+tts@example.ai", "联系邮箱：ops+tts@example.ai。"),
    ("mention", "@Fried_rice 说这是 source map 暴露。", "@Fried_rice 说这是 source map 暴露。"),
    ("reddit", "去 r/singularity 看讨论。", "去 r/singularity 看讨论。"),
    ("hashtag_chain", "#张雪峰#张雪峰[话题]#张雪峰事件", "#张雪峰#张雪峰[话题]#张雪峰事件。"),
    (
        "mention_hashtag_boundary",
        "关注@biscuit0228_并转发#thetime_tbs",
        "关注 @biscuit0228_ 并转发 #thetime_tbs。",
    ),
    ("speaker_bracket", "[S1]你好。[S2]收到。", '"S1"你好。"S2"收到。'),
    ("event_bracket", "请模仿 {whisper} 的语气说“别出声”。", '请模仿 "whisper" 的语气说“别出声”。'),
    ("order_bracket", "订单号：[AB-1234-XYZ]", '订单号："AB-1234-XYZ"。'),
    ("struct_headline", "〖重磅〗《新品发布》——现在开始！", '"重磅"《新品发布》。现在开始！'),
    (
        "struct_notice",
        "【公告】今天 20:00 维护——预计 30 分钟。",
        '"公告"今天20:00维护。预计30分钟。',
    ),
    ("struct_quote_chain", "『特别提醒』「不要外传」", '"特别提醒""不要外传"。'),
    ("struct_embedded_quote", "他说【重要通知】明天发布。", '他说"重要通知"明天发布。'),
    (
        "flow_arrow_chain",
        "请求接入 -> 身份与策略判定 -> 域服务处理",
        "请求接入，身份与策略判定，域服务处理。",
    ),
    ("flow_arrow_no_space", "A->B", "A，B。"),
    ("flow_arrow_unicode", "配置中心→推理编排→运行时执行", "配置中心，推理编排，运行时执行。"),
    ("embedded_title", "我喜欢《哈姆雷特》这本书。", "我喜欢《哈姆雷特》这本书。"),
    ("noise_qe", "真的假的？？？！！！", "真的假的？！"),
    (
        "noise_ellipsis",
        "这个包把 app.js.map 也发上去了......太离谱了！！！",
        "这个包把 app.js.map 也发上去了。太离谱了！",
    ),
    (
        "noise_ellipsis_cn",
        "【系统提示】请模仿{sad}低沉语气，说“今天下雨了……”",
        '"系统提示"请模仿"sad"低沉语气，说“今天下雨了。”',
    ),
    ("english_spaces", "This   is   a   test.", "This is a test."),
    ("chinese_spaces", "这 是\u3000一 段  含有多种空白的文本。", "这是一段含有多种空白的文本。"),
    ("mixed_spaces_1", "这是Anthropic的npm包", "这是 Anthropic 的 npm 包。"),
    ("mixed_spaces_2", "今天update到v2.3.1了", "今天 update 到 v2.3.1 了。"),
    ("mixed_spaces_3", "处理app.js.map文件", "处理 app.js.map 文件。"),
    ("underscore_plain_1", "foo_bar", "foo bar。"),
    ("underscore_plain_2", "中文_ABC", "中文 ABC。"),
    ("underscore_protected_mention", "关注@foo_bar", "关注 @foo_bar。"),
    (
        "markdown_link",
        "详情见 [release note](https://github.com/example/release)",
        "详情见 release note https://github.com/example/release。",
    ),
    (
        "markdown_heading",
        "# I made a free open source app to help with markdown files",
        "I made a free open source app to help with markdown files。",
    ),
    ("list_lines", "- 修复 .map 泄露\n- 发布 v2.3.1", "修复 .map 泄露。发布 v2.3.1。"),
    (
        "numbered_lines",
        "1. 安装依赖\n2. 运行测试\n3. 发布 v2.3.1",
        "安装依赖。运行测试。发布 v2.3.1。",
    ),
    ("newlines", "第一行\n第二行\n第三行", "第一行。第二行。第三行。"),
    ("terminal_punct_plain", "今天发布", "今天发布。"),
    ("terminal_punct_quoted", '他说"你好"', '他说"你好"。'),
    ("terminal_punct_existing", "今天发布。", "今天发布。"),
    ("terminal_punct_newlines", "第一行\n第二行。", "第一行。第二行。"),
    ("terminal_punct_blank_lines", "第一行\n\n第二行", "第一行。第二行。"),
    ("zero_width_url", "详见 https://x.com/\u200bSafety", "详见 https://x.com/Safety。"),
]


@pytest.mark.parametrize("name, text, expected", ROBUST_CASES, ids=[c[0] for c in ROBUST_CASES])
def test_robust_normalizer_matches_upstream_table(name, text, expected):
    assert normalize_tts_text(text) == expected


@pytest.mark.parametrize("name, text, expected", ROBUST_CASES, ids=[c[0] for c in ROBUST_CASES])
def test_robust_normalizer_is_idempotent(name, text, expected):
    assert normalize_tts_text(expected) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", ""),
        ("   \n\t ", ""),
        ("\x07\u200b", ""),
        ("line one\r\nline two", "line one。line two。"),
        ("a\u2028b", "a。b。"),  # str.splitlines also breaks at U+2028
        ("Hi!?", "Hi？！"),
        ("wait…", "wait…"),  # a single ellipsis char is kept
        ("one -- two", "one。two。"),
        ("《标题》", "标题。"),
    ],
)
def test_robust_normalizer_edge_cases(text, expected):
    assert normalize_tts_text(text) == expected


# The hyphen rules listed in upstream's normalizer docstring for the zh WeText branch.
@pytest.mark.parametrize(
    "text, expected",
    [
        ("10-3", "10-3"),
        ("2024-05-01", "2024-05-01"),
        ("-2", "-2"),
        ("为-2", "为-2"),
        ("为 -2", "为-2"),
        ("x=-2", "x=-2"),
        ("(-2)", "(-2)"),
        ("计算-2的绝对值", "计算-2的绝对值"),
        ("请求接入-身份判定", "请求接入，身份判定"),
        ("A-B", "A B"),
        ("A - B", "A B"),
        ("A-100", "A 100"),
        ("GPU-A100", "GPU A100"),
        ("TTS-demo", "TTS demo"),
        ("中文-ABC", "中文 ABC"),
        ("ABC-中文", "ABC 中文"),
    ],
)
def test_zh_hyphen_guard_keeps_minus_and_ranges_only(text, expected):
    assert guard_zh_hyphens(text) == expected


@pytest.mark.parametrize(
    "text, voice, language",
    [("你好 hello", "", "zh"), ("hello", "", "en"), ("123", "", "zh"), ("123", "Ava", "en"),
     ("こんにちは", "", "zh"), ("안녕", "", "zh")],
)  # fmt: skip
def test_wetext_language_resolution(text, voice, language):
    assert resolve_wetext_language(text, voice) == language


class RecordingWeText:
    def __init__(self):
        self.calls = []

    def __call__(self, text, language):
        self.calls.append((text, language))
        return text.replace("3", "三") if language == "zh" else text.replace("3", "three")


def test_default_pipeline_is_robust_once():
    prepared = prepare_texts("你好  世界")
    assert prepared.text == "你好世界。"
    assert prepared.stages == ("robust",) and prepared.language == ""
    assert prepared.prompt_text is None


def test_robust_and_wetext_run_robust_guard_wetext_robust():
    wetext = RecordingWeText()
    prepared = prepare_texts("请求接入-身份判定 3 次", prompt_text="前文-后文", wetext=wetext)
    assert prepared.stages == ("robust_pre", "wetext:zh", "robust_post")
    assert wetext.calls == [("请求接入，身份判定3次。", "zh"), ("前文，后文。", "zh")]
    assert prepared.text == "请求接入，身份判定三次。"
    assert prepared.prompt_text == "前文，后文。"


def test_wetext_only_skips_robust_and_guards_zh_only():
    wetext = RecordingWeText()
    prepared = prepare_texts("A-B has 3", robust=False, wetext=wetext)
    assert prepared.stages == ("wetext:en",) and prepared.text == "A-B has three"


def test_no_normalization_leaves_text_untouched():
    prepared = prepare_texts("  raw -- text ", prompt_text=" p ", robust=False)
    assert (
        prepared.stages == () and prepared.text == "  raw -- text " and prepared.prompt_text == "p"
    )


def test_prompt_text_that_normalizes_to_nothing_becomes_none():
    assert prepare_texts("hello", prompt_text="\u200b\x07").prompt_text is None
