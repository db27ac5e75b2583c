"""bench/streams_families.py: each Qwen3 family's random model is kept speaking in the code its
one-stream loop and its batch share (the end never drawn, however high its logit; the other
draws as before), and a checkpoint cached without a tokenizer is written again with one."""

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import delay_weights, local as bench_local, realtime as bench_realtime  # noqa: E402
from bench import streams_families as families  # noqa: E402
from bench.nano import SENTENCE  # noqa: E402
from converters.gguf_io import write_gguf  # noqa: E402
from converters.local import tensor_types  # noqa: E402
from moss_tts.errors import ModelFileError  # noqa: E402
from moss_tts.models import delay, local, local_v15, realtime  # noqa: E402
from moss_tts.models.delay_state import DelayState  # noqa: E402
from moss_tts.models.local_tts import LocalTTS  # noqa: E402
from moss_tts.sampling import (DelaySamplingOptions, LocalSamplingOptions,  # noqa: E402
                               LocalV15SamplingOptions, RealtimeSamplingOptions)


def logits_topped_by(n: int, top: int, seed: int = 0) -> np.ndarray:
    """Random logits [n] whose highest, by far, is `top`."""
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    x[top] = 50.0
    return x


def test_local_text_channel_never_draws_audio_end(monkeypatch):
    monkeypatch.setattr(local, "choose", local.choose)          # the patch ends with the test
    cfg = bench_local.config(True)
    logits = logits_topped_by(cfg.vocab_size, cfg.audio_end_token_id)
    greedy, sampled = LocalSamplingOptions().greedy(), LocalSamplingOptions()
    rng = np.random.default_rng(0)
    assert local.choose(logits, 0, None, cfg, greedy, rng) == cfg.audio_end_token_id
    families._local_keep_speaking()
    families._local_keep_speaking()                            # once per process, however called
    assert local.choose(logits, 0, None, cfg, greedy, rng) == int(np.argsort(logits)[-2])
    drawn = {local.choose(logits, 0, None, cfg, sampled, rng) for _ in range(50)}
    assert cfg.audio_end_token_id not in drawn and len(drawn) > 1


def test_local_v15_continues_after_drawing_its_2_way_head_as_before(monkeypatch):
    monkeypatch.setattr(local_v15, "decide", local_v15.decide)
    stop = logits_topped_by(2, local_v15.STOP)
    opts = LocalV15SamplingOptions()
    plain_rng, kept_rng = np.random.default_rng(3), np.random.default_rng(3)
    assert local_v15.decide(stop, plain_rng, opts) == local_v15.STOP
    families._v15_keep_speaking()
    assert local_v15.decide(stop, kept_rng, opts) == local_v15.CONTINUE
    assert kept_rng.bit_generator.state == plain_rng.bit_generator.state   # the same draws


def test_realtime_no_codebook_draws_a_code_the_codec_cannot_take(monkeypatch):
    """EOS on codebook 0 stops the turn; the pad, BOS or EOS on any codebook ends its audio."""
    monkeypatch.setattr(realtime.TurnSampler, "choose", realtime.TurnSampler.choose)
    cfg = bench_realtime.config(True)
    turn = realtime.TurnSampler(cfg, RealtimeSamplingOptions(do_sample=False),
                                np.random.default_rng(0))
    special = (cfg.audio_pad_token, cfg.audio_bos, cfg.audio_eos)
    topped = [logits_topped_by(cfg.audio_vocab_size, code) for code in special]
    assert [turn.choose(j, t, None) for j in (0, 1) for t in topped] == [*special, *special]
    families._realtime_keep_speaking()
    for t in topped:
        best = int(np.argmax(t[:cfg.codebook_size]))
        assert turn.choose(0, t, None) == turn.choose(1, t, None) == best


def test_delay_text_head_never_draws_the_delay_slot(monkeypatch):
    monkeypatch.setattr(delay, "next_row", delay.next_row)
    cfg = delay_weights.config("tts", tiny=True)
    rows = np.full((4, 1 + cfg.n_vq), cfg.audio_pad_code, dtype=np.int64)
    rows[:, 0] = [1000, 1001, cfg.audio_start_token_id, cfg.audio_assistant_gen_slot_token_id]
    state = dataclasses.replace(DelayState.from_prompt(rows[:, 0], cfg.ids), step=cfg.n_vq + 1)
    assert state.is_audio
    text = logits_topped_by(cfg.vocab_size, cfg.audio_assistant_delay_slot_token_id)
    audio = np.zeros((cfg.n_vq, cfg.audio_rows), np.float32)
    seen = delay.audio_seen(rows[:, 1:], cfg)
    greedy = DelaySamplingOptions().greedy()
    args = (audio, seen, cfg, greedy, np.random.default_rng(0))
    assert delay.next_row(state, text, *args)[0][0] == cfg.audio_assistant_delay_slot_token_id
    families._delay_keep_speaking()
    assert delay.next_row(state, text, *args)[0][0] == cfg.audio_assistant_gen_slot_token_id
    # a generation prompt ends at assistant\n: the patched head starts audio whatever it favours
    start = DelayState.from_prompt(rows[:2, 0], cfg.ids)
    assert not start.is_audio
    assert delay.next_row(start, logits_topped_by(cfg.vocab_size, 1000), *args)[0][0] == \
        cfg.audio_start_token_id


def test_a_checkpoint_cached_without_a_tokenizer_is_written_again(tmp_path):
    args = argparse.Namespace(tiny=True, type="f32", data=str(tmp_path))
    cfg = bench_local.config(True)
    stale = tmp_path / "local-tiny-f32.gguf"                  # as bench/local.py wrote it before
    meta = cfg.to_metadata() | {local.TOKENIZER_KEY: "{}"}
    write_gguf(stale, bench_local.tensor_values(cfg), meta, kind=local.KIND, version=local.FORMAT_VERSION, type_for=tensor_types("f32"))
    with pytest.raises(ModelFileError, match="not a usable tokenizer.json"):
        LocalTTS.load(str(stale), threads=1)
    said = []
    driver = argparse.Namespace(say=said.append)
    families._with_tokenizer(lambda: bench_local.weights_file(args), local.TOKENIZER_KEY, driver)
    assert said == [f"{stale}: written without a tokenizer: writing it again"]
    with LocalTTS.load(str(stale), threads=1) as tts:
        assert len(tts.plan(SENTENCE)) > 0
    families._with_tokenizer(lambda: bench_local.weights_file(args), local.TOKENIZER_KEY, driver)
    assert len(said) == 1                                     # a fresh one is left alone
