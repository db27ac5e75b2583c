"""RealtimeTTS and its LiveSession (models/realtime_tts.py, models/realtime_live.py) with the
tiny steered Realtime model (it speaks one frame per text token, then stops on EOS) and the tiny
24 kHz-style (v1) codec:
offline stream == synthesize == the decode of the generated frames; a live session fed one
token at a time draws the frames offline generation draws over the same text ids (greedy);
frames paced by the text; multi-turn KV reuse == re-prefill of the whole conversation; the
segmenting of deltas; bad input."""

import functools
import itertools

import numpy as np
import pytest

from fixtures.compare import assert_close
from fixtures.make_realtime import CODEBOOK, RVQ, SAMPLE_RATE
from moss_tts.codec.codec import StreamDecoder
from moss_tts.errors import InputError, ModelFileError
from moss_tts.load import tts_class
from moss_tts.models.realtime import sanitized
from moss_tts.models import realtime_live
from moss_tts.models.realtime_live import MAX_BUFFER, MIN_SEGMENT, SEGMENT_END, TextSegmenter
from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.sampling import RealtimeSamplingOptions

GREEDY = RealtimeSamplingOptions(do_sample=False)   # the penalty (1.1) stays on, as upstream
from moss_tts.text import realtime_prompts as prompts
from moss_tts.models.tts import TTS, Reference


# the codec's streaming decoder equals its offline decode up to f32 kernel order (codec tests)
DECODE_ATOL = 1e-5
HOP = 64                      # samples per frame of the tiny v1 codec
# 42 tokens of the tiny tokenizer, cut into 5 segments by the session
TEXT = "Hello there, quick brown foxes jump. Over lazy dogs; every day, 12345."
TURN2 = "Sure, here is another answer for you, in English."


def offline_audio(tts, frames):
    frames = sanitized(frames, tts.config)
    return tts.codec.decode(frames.T)[:, 0] if len(frames) else np.zeros(0, np.float32)


def tokenwise(tts, text):
    """The text as the deltas an LLM streams: one token's text each."""
    return [tts.tokenizer.decode([i]) for i in tts.tokenizer.encode(text)]


def replay(tts, session_rows, text_ids, frames):
    """The rows a finished turn fed the backbone: its prompt and lead rows, then one row per
    later frame, [next text id or <|text_pad|>, the frame before] (P15)."""
    lead = tts.ids.lead
    rows = [session_rows, prompts.lead_rows(text_ids[:lead], tts.ids)]
    rest = text_ids[lead:]
    for n in range(1, len(frames)):
        text = rest[n - 1] if n - 1 < len(rest) else tts.ids.text_pad
        rows.append(np.concatenate([[text], frames[n - 1]])[None])
    return np.vstack(rows)


@pytest.mark.parametrize("options, seed", [(GREEDY, None), (RealtimeSamplingOptions(), 7)],
                         ids=["greedy", "sampled"])
def test_stream_equals_synthesize_equals_offline_decode(realtime_tts, options, seed):
    tts = realtime_tts()
    # one frame a push (the ladder's own pace follows the clock: chunk_ladder tests)
    chunks = list(tts.stream(TEXT, options=options, seed=seed, chunk_frames=1))
    audio, sr = tts.synthesize(TEXT, options=options, seed=seed)
    assert sr == SAMPLE_RATE and audio.shape[1] == 1 and len(chunks) > 5
    assert all(c.shape == (HOP, 1) for c in chunks)
    np.testing.assert_array_equal(np.concatenate(chunks), tts.synthesize(
        TEXT, options=options, seed=seed, chunk_frames=1)[0])
    # whole audio pushes 8 frames at a time: the codec's sums round otherwise (codec tests)
    assert_close(audio, np.concatenate(chunks), atol=DECODE_ATOL, what="8-frame pushes")
    again, _ = tts.synthesize(TEXT, options=options, seed=seed)
    np.testing.assert_array_equal(again, audio)
    adaptive = np.concatenate(list(tts.stream(TEXT, options=options, seed=seed)))
    assert_close(adaptive, audio, atol=DECODE_ATOL, what="the adaptive pushes")
    rows, text_ids = tts.plan(TEXT)
    frames = tts.generate(rows, text_ids, options=options, seed=seed)
    assert_close(audio[:, 0], offline_audio(tts, frames), atol=DECODE_ATOL, what="offline")
    if seed is None:   # the steered model speaks one frame per text token
        assert len(frames) == len(tts.tokenizer.encode(TEXT)) - 12 + 1


def test_live_session_fed_token_by_token_draws_the_offline_frames(realtime_tts):
    tts = realtime_tts()
    with tts.session(options=GREEDY) as s:
        live = [s.push_text(delta) for delta in tokenwise(tts, TEXT)]
        s.end_text()
        live += list(s.drain())
        frames, text_ids = s.frames, s.text_ids
    assert all(c.dtype == np.float32 and c.ndim == 1 for c in live)
    # audio comes at each cut segment once the lead is in, before the text ends
    assert sum(c.size > 0 for c in live[:-3]) >= 3, "no audio came while the text streamed"
    lead = tts.ids.lead
    prompt = np.vstack([prompts.system_rows(tts.tokenizer, tts.ids),
                        prompts.assistant_prefix_rows(tts.tokenizer, tts.ids, first=True),
                        prompts.lead_rows(text_ids[:lead], tts.ids)])
    want = tts.generate(prompt, text_ids[lead:], options=GREEDY)
    assert frames[-1, 0] == tts.config.audio_eos and len(want) == len(text_ids) - lead + 1
    np.testing.assert_array_equal(frames[:-1], want)
    assert_close(np.concatenate(live), offline_audio(tts, want), atol=DECODE_ATOL, what="live")
    # guard: other text draws other frames
    with tts.session(options=GREEDY) as s:
        s.push_text(TEXT[::-1])
        s.end_text()
        list(s.drain())
        assert not np.array_equal(s.frames[:len(frames)], frames)


def test_the_speech_does_not_depend_on_how_the_text_was_split(realtime_tts):
    tts = realtime_tts()
    text = "Hello there, this is it; and more. Then words without any cut at all here ok"

    def frames_for(deltas):
        with tts.session(options=GREEDY) as s:
            for d in deltas:
                s.push_text(d)
            list(s.drain())
            return s.frames, s.text_ids

    whole = frames_for([text])
    rng = np.random.default_rng(3)
    cuts = sorted(rng.choice(np.arange(1, len(text)), size=9, replace=False))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    for deltas in (list(text), pieces, ["Hello there,", " this is it;", text[24:]]):
        frames, ids = frames_for(deltas)
        assert ids == whole[1]
        np.testing.assert_array_equal(frames, whole[0])


def test_frames_are_paced_by_the_text(realtime_tts):
    """Nothing before the 12th token; then the prefill's frame and one frame per later token,
    at once; the rest (one frame for the last token's row and EOS) only in drain()."""
    tts = realtime_tts()
    with tts.session(options=GREEDY) as s:
        pieces, seen = ["Hello there, ", "this is a tiny test of speech. ", "Chinese English, ",
                        "12345, and more text here."], 0
        for piece in pieces:
            audio = s.push_text(piece)
            n = len(s.text_ids)
            want = 0 if n < 12 else (n - 11) - seen
            assert audio.size == want * HOP, piece
            seen += want
        s.end_text()
        rest = list(s.drain())
        assert sum(c.size for c in rest) == (len(s.text_ids) - 11 - seen) * HOP
        assert s.frames[-1, 0] == tts.config.audio_eos
        assert s.push_text.__self__ is s and list(s.drain()) == []   # drained: nothing more


def test_the_frames_one_call_draws_go_to_the_codec_in_one_push(realtime_tts, monkeypatch):
    """Text that draws several frames at once (here the whole text in one call) hands them to
    the codec together — a push reads every decoder weight however few its frames — and its
    audio is, bit for bit, the frames' audio drawn one call at a time."""
    tts = realtime_tts()
    ids = tts.tokenizer.encode(TEXT)
    with tts.session(options=GREEDY) as s:
        one_by_one = np.concatenate([s.push_tokens([i]) for i in ids])
    pushed = []
    push = StreamDecoder.push
    monkeypatch.setattr(StreamDecoder, "push",
                        lambda self, codes: pushed.append(np.shape(codes)[1]) or push(self, codes))
    with tts.session(options=GREEDY) as s:
        together = s.push_tokens(ids)
    assert pushed == [len(ids) - 11]          # the lead's frame and one a token after it
    np.testing.assert_array_equal(together, one_by_one)


def test_a_drain_behind_its_codec_pushes_the_frames_that_pile_up(realtime_tts, monkeypatch):
    """drain() pushes one frame a chunk while the codec keeps up; on a clock where every push
    takes a second (far behind), the frames that pile up go in one push, twice as many each
    time (models/chunk_ladder.py) — with the same audio."""
    tts = realtime_tts()
    text = "Hello there quick brown foxes j"      # no cut before MAX_BUFFER: all in the drain

    def drained():
        with tts.session(options=GREEDY) as s:
            assert s.push_text(text).size == 0
            return list(s.drain())
    at_pace = drained()
    ticks = itertools.count()
    monkeypatch.setattr(realtime_live, "ChunkLadder", functools.partial(
        realtime_live.ChunkLadder, clock=lambda: float(next(ticks))))
    behind = drained()
    sizes = [len(c) // HOP for c in behind]
    assert sizes[:3] == [1, 2, 4] and len(behind) < len(at_pace), sizes
    np.testing.assert_array_equal(np.concatenate(behind), np.concatenate(at_pace))


def test_pushed_token_ids_draw_a_frame_each_from_the_twelfth_on(realtime_tts):
    """push_tokens: no audio for tokens 1..11, one frame's audio for the 12th and each later
    one, the same frames as offline generation over those ids; control ids are refused."""
    tts = realtime_tts()
    ids = tts.tokenizer.encode(TEXT)
    with tts.session(options=GREEDY) as s:
        sizes = [s.push_tokens([i]).size for i in ids]
        assert sizes == [0] * 11 + [HOP] * (len(ids) - 11)
        assert list(s.drain()) == []       # the <|text_pad|> row draws EOS: no more audio
        frames = s.frames
        assert frames[-1, 0] == tts.config.audio_eos and s.text_ids == ids
        with pytest.raises(InputError, match="no control ids"):
            s.new_turn()
            s.push_tokens([tts.config.im_end_token_id])
    rows, text_ids = tts.plan(TEXT)
    np.testing.assert_array_equal(frames[:-1], tts.generate(rows, text_ids, options=GREEDY))


def test_long_wait_before_end_text_keeps_the_twelve_token_lead(realtime_tts):
    """Text that reaches the session only at end_text (no segment cut before): the lead is
    still 12 tokens, the rest one frame each (upstream's session would prefill them all)."""
    tts = realtime_tts()
    text = "Quick foxes jumped high"     # < 32 characters, no punctuation: 23 tokens
    with tts.session(options=GREEDY) as s:
        assert s.push_text(text).size == 0
        s.end_text()
        chunks = list(s.drain())
        n = len(s.text_ids)
        assert n > 12 and len(chunks) == n - 12 + 1


def test_multi_turn_cache_reuse_equals_reprefill_of_the_whole_conversation(realtime_tts):
    tts = realtime_tts()
    user_audio = Reference(np.random.default_rng(1).integers(0, CODEBOOK, size=(5, RVQ)))
    with tts.session(options=GREEDY) as s:
        s.push_text(TEXT)
        list(s.drain())
        turn1 = (s.frames, s.text_ids)
        s.new_turn(user_text="What did you say?", user_audio=user_audio)
        for piece in tokenwise(tts, TURN2):
            s.push_text(piece)
        list(s.drain())
        turn2 = (s.frames, s.text_ids)
    assert turn1[0][-1, 0] == tts.config.audio_eos == turn2[0][-1, 0]
    head = np.vstack([prompts.system_rows(tts.tokenizer, tts.ids),
                      prompts.assistant_prefix_rows(tts.tokenizer, tts.ids, first=True)])
    rows = np.vstack([
        replay(tts, head, turn1[1], turn1[0]), prompts.eos_row(tts.ids),
        prompts.user_turn_rows(tts.tokenizer, tts.ids, "What did you say?", user_audio.codes,
                               first=False),
        prompts.assistant_prefix_rows(tts.tokenizer, tts.ids, first=False),
        prompts.lead_rows(turn2[1][:12], tts.ids)])
    want = tts.generate(rows, turn2[1][12:], options=GREEDY)
    np.testing.assert_array_equal(turn2[0][:-1], want)
    # guard: the second turn depends on the first (a fresh conversation draws other frames)
    with tts.session(options=GREEDY) as s:
        s.new_turn(user_text="What did you say?", user_audio=user_audio)
        s.push_text(TURN2)
        list(s.drain())
        assert not np.array_equal(s.frames, turn2[0])


def test_a_turn_cut_before_its_first_frame_leaves_no_eos_row(realtime_tts):
    """Turn 2 takes 5 tokens (4 reach the backbone, the 5th waits to show it is not the last)
    and is cut by new_turn: the conversation then holds turn 1, its EOS row, turn 2's prefix
    and 4 lead rows — no EOS row for turn 2 — and turn 3 follows."""
    tts = realtime_tts()
    head = np.vstack([prompts.system_rows(tts.tokenizer, tts.ids),
                      prompts.assistant_prefix_rows(tts.tokenizer, tts.ids, first=True)])
    later = prompts.assistant_prefix_rows(tts.tokenizer, tts.ids, first=False)
    ids = tts.tokenizer.encode(TEXT)
    with tts.session(options=GREEDY) as s:
        s.push_tokens(ids)
        list(s.drain())
        turn1 = (s.frames, s.text_ids)
        s.new_turn()
        assert s.push_tokens(ids[:5]).size == 0 and len(s.text_ids) == 4
        cut = s.text_ids
        s.new_turn()
        s.push_tokens(ids)
        list(s.drain())
        turn3 = s.frames
    rows = np.vstack([replay(tts, head, turn1[1], turn1[0]), prompts.eos_row(tts.ids), later,
                      prompts.text_rows(cut, tts.ids), later, prompts.lead_rows(ids[:12], tts.ids)])
    np.testing.assert_array_equal(turn3[:-1], tts.generate(rows, ids[12:], options=GREEDY))


def test_a_user_turn_before_the_first_answer_opens_without_im_end(realtime_tts):
    """new_turn() on a fresh session: system block, `<|im_start|>user\\n…` (first turn, P17),
    then the assistant prefix — as a prefill of those rows draws."""
    tts = realtime_tts()
    with tts.session(options=GREEDY) as s:
        s.new_turn(user_text="Tell me a story.")
        s.push_text(TEXT)
        list(s.drain())
        frames, text_ids = s.frames, s.text_ids
    rows = np.vstack([prompts.system_rows(tts.tokenizer, tts.ids),
                      prompts.user_turn_rows(tts.tokenizer, tts.ids, "Tell me a story.",
                                             first=True),
                      prompts.assistant_prefix_rows(tts.tokenizer, tts.ids, first=False),
                      prompts.lead_rows(text_ids[:12], tts.ids)])
    np.testing.assert_array_equal(frames[:-1], tts.generate(rows, text_ids[12:], options=GREEDY))


def test_max_frames_caps_a_turn_and_new_turn_cuts_a_turn_short(realtime_tts):
    tts = realtime_tts()
    with tts.session(options=GREEDY, max_frames=3) as s:
        s.push_text(TEXT)
        list(s.drain())
        assert len(s.frames) == 3 and s.frames[-1, 0] != tts.config.audio_eos
        s.new_turn()                        # no EOS row: the turn was cut
        assert s.push_text(TURN2).size > 0


def test_voice_clone_reference_changes_the_speech(realtime_tts):
    tts = realtime_tts()
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    voice = tts.encode_reference(0.3 * np.sin(2 * np.pi * 220 * t), SAMPLE_RATE)
    assert voice.codes.shape == (len(t) // HOP, RVQ) and voice.codes.max() < CODEBOOK
    rows, _ = tts.plan(TEXT, reference=voice)
    assert (rows[:, 0] == tts.config.reference_audio_pad).sum() == len(voice.codes)
    cloned, _ = tts.synthesize(TEXT, reference=voice, options=GREEDY)
    plain, _ = tts.synthesize(TEXT, options=GREEDY)
    assert cloned.size and not np.array_equal(plain, cloned)
    with tts.session(voice=voice, options=GREEDY) as s:
        s.push_text(TEXT)
        list(s.drain())
        frames, text_ids = s.frames, s.text_ids
    rows = np.vstack([prompts.system_rows(tts.tokenizer, tts.ids, voice.codes),
                      prompts.assistant_prefix_rows(tts.tokenizer, tts.ids, first=True),
                      prompts.lead_rows(text_ids[:12], tts.ids)])
    np.testing.assert_array_equal(frames[:-1], tts.generate(rows, text_ids[12:], options=GREEDY))


def test_realtime_tts_offers_the_tts_protocol_and_load_picks_it(realtime_tts, realtime_files):
    tts = realtime_tts()
    assert isinstance(tts, TTS) and tts.channels == 1 and tts.sample_rate == SAMPLE_RATE
    assert tts_class(realtime_files(True)[2]) is RealtimeTTS


def rescanned_segments(text: str, *, cut_without_space: bool) -> list[str]:
    """The segments of `text` pushed a character at a time into the segmenter this module had
    before issue 31 (upstream's `_extract_text_segments` at 58b20a0, rescanning the whole
    buffer after each character), then the rest at the turn's end; `cut_without_space` adds
    upstream's later cut (f12b607) of a buffer of MAX_BUFFER characters with no space."""
    def split(buffer):
        segments = []
        while buffer:
            cut = None
            if len(buffer) >= MIN_SEGMENT:
                cut = next((m.end() for m in SEGMENT_END.finditer(buffer)
                            if m.end() >= MIN_SEGMENT), None)
            if cut is None and len(buffer) >= MAX_BUFFER and " " in buffer:
                cut = buffer.rindex(" ") + 1
            elif cut is None and len(buffer) >= MAX_BUFFER and cut_without_space:
                cut = MAX_BUFFER
            if cut is None:
                break
            segments.append(buffer[:cut])
            buffer = buffer[cut:]
        return segments, buffer

    out, buffer = [], ""
    for ch in text:
        segments, buffer = split(buffer + ch)
        out += segments
    return out + ([buffer] if buffer else [])


NO_PUNCTUATION = "没有标点也没有空格的中文" * 3      # 36 characters


def segmented(text: str) -> list[str]:
    segmenter, out = TextSegmenter(), []
    for ch in text:
        if (segment := segmenter.push(ch)) is not None:
            out.append(segment)
    return out + ([rest] if (rest := segmenter.flush()) else [])


@pytest.mark.parametrize("text, segments", [
    ("Hello", ["Hello"]),
    ("Hi, yo", ["Hi, yo"]),                                # under 8 characters: no cut
    ("Hi, you.", ["Hi, you."]),                            # the first cut ending at ≥ 8
    ("Hello there, how", ["Hello there,", " how"]),        # cut at the mark, as it comes
    ("Hello there. How are you? Fine", ["Hello there.", " How are you?", " Fine"]),
    ("word " * 7 + "x", ["word " * 6, "word x"]),          # 32 characters: the last space
    ("你好世界，今天天气很好。然后", ["你好世界，今天天气很好。", "然后"]),
    ("a-b-c-d-e-f-g-h-i", ["a-b-c-d-", "e-f-g-h-", "i"]),
    ("Hi,\t\t\t\t\tthere", ["Hi,\t\t\t\t\t", "there"]),   # whitespace extends a mark's match
    ("abcdef. xyz", ["abcdef. ", "xyz"]),
    ("abcdef\n xyz", ["abcdef\n xyz"]),                    # ... not a lone newline's
    ("y" * 70, ["y" * 32, "y" * 32, "y" * 6]),             # no space: cut at 32 (f12b607)
    (NO_PUNCTUATION, [NO_PUNCTUATION[:32], NO_PUNCTUATION[32:]]),
])
def test_text_is_cut_a_character_at_a_time_as_upstream(text, segments):
    assert segmented(text) == segments


def test_segments_equal_the_rescanning_segmenter_on_varied_texts():
    """The same segments as the segmenter it replaces, pushed a character at a time, on texts
    of marks, spaces, other whitespace, CJK and letters: exactly, where that one ever cut (its
    buffer never held 32 characters without a space); with upstream's later no-space cut,
    everywhere."""
    marks, letters = list(".,!?;:-)]\u2026\u2014\u2013。，！；\n"), list("abcxyz你好世界")
    blanks = [" ", " ", " ", "\t", "\r", "\u3000", "\xa0"]
    rng = np.random.default_rng(31)
    ordinary = 0
    for trial in range(3000):
        # marks and blanks from none to many; every other text without a space
        p_mark, p_blank = rng.choice([0, .02, .1, .3]), rng.choice([0, .05, .3])
        blank = blanks if trial % 2 else blanks[3:]
        text = "".join(rng.choice(marks) if r < p_mark else
                       rng.choice(blank) if r < p_mark + p_blank else rng.choice(letters)
                       for r in rng.random(rng.integers(0, 120)))
        got = segmented(text)
        assert got == rescanned_segments(text, cut_without_space=True), text
        if got == rescanned_segments(text, cut_without_space=False):
            ordinary += 1
        else:       # only a buffer of 32 characters with no space differs
            assert any(len(s) == MAX_BUFFER and " " not in s for s in got), text
    assert 500 < ordinary < 2500     # both kinds of text were tried


def test_session_bad_input(realtime_tts):
    tts = realtime_tts()
    s = tts.session(options=GREEDY)
    with pytest.raises(InputError, match="push_text takes text"):
        s.push_text(b"bytes")
    s.end_text()
    with pytest.raises(InputError, match="push_text after end_text"):
        s.push_text("more")
    assert list(s.drain()) == []            # no text this turn: nothing to say
    s.close()
    s.close()
    for call in (lambda: s.push_text("x"), s.end_text, s.drain, s.new_turn):
        with pytest.raises(InputError, match="session is closed"):
            call()
    with pytest.raises(InputError, match=r"max_frames must be a whole number in \[1, "):
        tts.session(max_frames=0)
    with pytest.raises(InputError, match=r"max_rows must be a whole number in \[1, "):
        tts.session(max_rows=0)


def test_offline_bad_input(realtime_tts, realtime_files, codec_gguf):
    tts = realtime_tts()
    with pytest.raises(InputError, match="text is empty"):
        tts.synthesize("   ")
    with pytest.raises(ModelFileError, match="mismatched codec"):   # Nano's 48 kHz stereo one
        RealtimeTTS.load(realtime_files(True)[2], codec=codec_gguf, threads=1)
    bare = RealtimeTTS.load(realtime_files(True)[2], threads=1)
    with bare, pytest.raises(InputError, match="no codec loaded"):
        bare.session()
