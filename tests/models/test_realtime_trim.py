"""A live conversation that outgrows its cache drops its oldest turns (issue 23, hole 4): the
cache is then exactly a fresh one fed the rows kept, laid out as a conversation that began
with the first turn kept (docs/upstream-notes.md P17), and the conversation goes on."""

import numpy as np

from moss_tts.text import realtime_prompts as prompts

TEXT = "Hello there, this is a live test. It speaks as the text arrives!"


def test_refeed_leaves_exactly_the_cache_a_fresh_stream_fed_the_same_rows_has(realtime_tts):
    tts = realtime_tts()
    rows, _ = tts.plan(TEXT)
    kept, probe = rows[len(rows) // 2:], rows[-1:]
    streams = [tts.model.stream(1024, seed=1) for _ in range(3)]
    trimmed, fresh, untrimmed = streams
    try:
        trimmed.feed(rows)
        trimmed.refeed(kept)
        fresh.feed(kept)
        assert np.array_equal(trimmed.rows, fresh.rows) and trimmed.position == len(kept)
        assert np.array_equal(trimmed.feed(probe), fresh.feed(probe))
        # sensitivity: rows left in the cache would change what the probe row sees
        untrimmed.feed(rows)
        untrimmed.feed(kept)
        assert not np.allclose(untrimmed.feed(probe), fresh.feed(probe))
    finally:
        for stream in streams:
            stream.close()


def test_a_long_conversation_drops_its_oldest_turns_keeping_the_system_block(realtime_tts):
    tts = realtime_tts()
    system = prompts.system_rows(tts.tokenizer, tts.ids)
    with tts.session(seed=1, max_rows=640) as s:      # the block and about seven turns
        for turn in range(16):
            if turn:
                s.new_turn("And again?")
            audio = [s.push_text(ch) for ch in TEXT]
            s.end_text()
            audio += list(s.drain())
            assert sum(a.size for a in audio) > 0, f"turn {turn} said nothing"
        held = s.cache_rows
        assert s.turns_dropped > 0 and len(held) == s.rows[0] <= 640
    assert np.array_equal(held[:len(system)], system)
    # the first turn kept opens as a conversation's first turn: `<|im_start|>user\n...`
    opening = prompts.user_turn_rows(tts.tokenizer, tts.ids, "And again?", first=True)
    assert np.array_equal(held[len(system):len(system) + len(opening)], opening)
