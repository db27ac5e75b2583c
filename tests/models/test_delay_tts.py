"""DelayTTS (models/delay_tts.py) with the tiny Delay model and the tiny 24 kHz-style (v1)
codec: streamed audio == synthesize() == the offline route (de-delay the generated rows, split
into segments, codec.decode each); voice cloning through the codec; bad input."""

import numpy as np
import pytest

from fixtures.compare import assert_close
from fixtures.make_delay import N_VQ, SAMPLE_RATE
from moss_tts.errors import InputError, ModelFileError
from moss_tts.models.delay_state import audio_segments, de_delay
from moss_tts.models.delay_tts import DelayTTS, FrameAssembler
from moss_tts.models.message_tts import join_transcript
from moss_tts.sampling import DelaySamplingOptions
from moss_tts.models.tts import TTS, Reference

from .conftest import THREADS

# the codec's streaming decoder equals its offline decode up to f32 kernel order (codecs tests)
DECODE_ATOL = 1e-5
GREEDY = DelaySamplingOptions().greedy()


@pytest.fixture(scope="module")
def tts(delay_files, v1_codec_gguf):
    t = DelayTTS.load(delay_files(4.0)[3], codec=v1_codec_gguf, threads=THREADS)
    yield t
    t.close()


def offline(tts, text, **kw):
    """The offline route of §family-2.8 from the same generated rows."""
    rows = tts.model.generate(tts.plan(text), **kw)
    segments = audio_segments(de_delay(rows[:, 1:]), tts.config.audio_pad_code)
    return np.concatenate([tts.codec.decode(s.T) for s in segments]), len(segments)


@pytest.mark.parametrize("options, seed", [(GREEDY, None), (DelaySamplingOptions(), 7)],
                         ids=["greedy", "sampled"])
def test_stream_equals_synthesize_equals_offline_decode(tts, options, seed):
    text = "Hello there."
    chunks = list(tts.stream(text, options=options, seed=seed, max_new_rows=24, chunk_frames=1))
    audio, sr = tts.synthesize(text, options=options, seed=seed, max_new_rows=24)
    assert sr == SAMPLE_RATE and audio.shape[1] == 1 and len(chunks) > 2
    assert {len(c) for c in chunks} == {len(chunks[0])}     # a frame a push
    # whole audio pushes 8 frames at a time, a frame a push 1, the adaptive ladder as the
    # clock says: the tiny f32 codec's stream gives the same samples whatever the grouping
    np.testing.assert_array_equal(
        tts.synthesize(text, options=options, seed=seed, max_new_rows=24)[0], audio)
    np.testing.assert_array_equal(np.concatenate(chunks), audio)
    adaptive = list(tts.stream(text, options=options, seed=seed, max_new_rows=24))
    assert len(adaptive[0]) == 4 * len(chunks[0])            # upstream's first chunk
    np.testing.assert_array_equal(np.concatenate(adaptive), audio)
    want, n_segments = offline(tts, text, options=options, seed=seed, max_new_rows=24)
    assert n_segments >= 1
    assert_close(audio, want, atol=DECODE_ATOL, what="streamed vs offline decode")


def test_frames_complete_along_the_staircase():
    rows = np.arange(1, 25).reshape(6, 4)          # generated rows' codes, 4 codebooks
    asm = FrameAssembler(4)
    frames = [f for f in (asm.push(r) for r in rows) if f is not None]
    np.testing.assert_array_equal(frames, de_delay(rows))
    assert len(frames) == 6 - 4 + 1


def test_voice_clone_reference_goes_through_the_codec_into_the_prompt(tts):
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    voice = tts.encode_reference(0.3 * np.sin(2 * np.pi * 220 * t), SAMPLE_RATE)
    assert voice.codes.shape == (len(t) // 64, N_VQ) and voice.codes.max() < 64
    rows = tts.plan("Hi.", reference=voice)
    assert (rows[:, 0] == tts.config.audio_user_slot_token_id).sum() == len(voice.codes) + N_VQ - 1
    audio, _ = tts.synthesize("Hi.", reference=voice, options=GREEDY, max_new_rows=12)
    assert audio.size and np.isfinite(audio).all()
    # guard: the reference changes what is generated
    plain, _ = tts.synthesize("Hi.", options=GREEDY, max_new_rows=12)
    assert plain.shape != audio.shape or not np.array_equal(plain, audio)


def test_delay_tts_offers_the_tts_protocol(tts):
    assert isinstance(tts, TTS) and tts.channels == 1 and tts.sample_rate == SAMPLE_RATE
    assert isinstance(tts.encode_reference(np.ones(640) * 0.1, SAMPLE_RATE), Reference)


def test_mismatched_codec_raises_model_file_error(delay_files, codec_gguf):
    with pytest.raises(ModelFileError, match="mismatched codec: it is 1600 Hz x 2 channel"):
        DelayTTS.load(delay_files()[3], codec=codec_gguf, threads=THREADS)


@pytest.mark.parametrize("text, match", [("", "text is empty"),
                                         ("Say <|endoftext|>", "control token spelling")])
def test_bad_text_raises_input_error(tts, text, match):
    with pytest.raises(InputError, match=match):
        tts.synthesize(text)


def test_synthesis_without_codec_raises_input_error(delay_files):
    with DelayTTS.load(delay_files()[3], threads=THREADS) as t:
        with pytest.raises(InputError, match="no codec loaded"):
            t.synthesize("Hi.")


def test_continuation_stream_continues_the_prompt_audio(tts):
    """The prompt frames (their staircase cut, P28) go through the codec first and their audio
    is dropped: the stream equals the offline decode of prompt + generated frames with the
    prompt's T frames of samples cut, as upstream trims the first segment."""
    prompt = Reference(np.random.default_rng(9).integers(0, 64, size=(6, N_VQ)))
    kw = dict(options=GREEDY, max_new_rows=20)
    got = np.concatenate(list(tts.stream("Prompt words. New words.", prompt=prompt, **kw)))
    rows = tts.plan("Prompt words. New words.", prompt=prompt)
    generated = tts.model.generate(rows, **kw)
    staircase = np.vstack([rows[-len(prompt.codes):, 1:], generated[:, 1:]])
    codes = de_delay(staircase)
    np.testing.assert_array_equal(codes[:3], prompt.codes[:3])   # complete prompt frames kept
    segments = audio_segments(codes, tts.config.audio_pad_code)
    full = np.concatenate([tts.codec.decode(s.T) for s in segments])
    hop = len(full) // sum(len(s) for s in segments)
    assert_close(got, full[len(prompt.codes) * hop:], atol=DECODE_ATOL,
                 what="continuation stream vs offline decode minus the prompt")
    # guard: keeping the prompt's audio would be a different (longer) result
    assert len(full) > len(got)


def test_seconds_set_the_tokens_field_at_the_codec_frame_rate(tts):
    rows = tts.plan("Hi.", seconds=2.0)
    want = tts.plan("Hi.", tokens=round(2.0 * SAMPLE_RATE / 64))   # 50 frames/s tiny codec
    np.testing.assert_array_equal(rows, want)
    assert not np.array_equal(rows, tts.plan("Hi.", tokens=99))
    with pytest.raises(InputError, match="seconds must be > 0"):
        tts.plan("Hi.", seconds=1.0, tokens=5)
    with pytest.raises(InputError, match="seconds must be > 0"):
        tts.plan("Hi.", seconds=0)


def test_research_steps_pass_through_to_the_model(tts):
    rows = tts.plan("Hi.")
    hidden, text, audio = tts.forward(rows)
    assert hidden.shape[0] == text.shape[0] == audio.shape[1] == len(rows)
    np.testing.assert_array_equal(tts.generate(rows, options=GREEDY, max_new_rows=5),
                                  tts.model.generate(rows, options=GREEDY, max_new_rows=5))


def test_a_long_reference_is_cut_like_nanos_and_a_fractional_rate_is_refused(tts, caplog):
    """The reference rule of Nano holds for Delay too: past REFERENCE_MAX_SECONDS the voice is
    its first 30 s (said in a warning), max_seconds=None keeps it all; 16000.5 Hz is refused."""
    import logging

    from moss_tts.audio import REFERENCE_MAX_SECONDS

    rng = np.random.default_rng(3)
    n_cut = int(REFERENCE_MAX_SECONDS * SAMPLE_RATE)
    long = (0.1 * rng.standard_normal(SAMPLE_RATE * 40)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="moss_tts.audio"):
        voice = tts.encode_reference(long, SAMPLE_RATE)
    assert "40.0 s long; using its first 30 s" in caplog.text
    cut = tts.encode_reference(long[:n_cut], SAMPLE_RATE)
    np.testing.assert_array_equal(voice.codes, cut.codes)
    whole = tts.encode_reference(long, SAMPLE_RATE, max_seconds=None)
    assert len(whole.codes) > len(voice.codes)
    with pytest.raises(InputError, match="sample_rate must be a whole number"):
        tts.encode_reference(long[:SAMPLE_RATE], SAMPLE_RATE + 0.5)


@pytest.mark.parametrize("transcript, text, joined", [
    ("Prompt words.", "New words.", "Prompt words. New words."),
    ("Prompt words.  ", "  New words.", "Prompt words. New words."),
    ("你好。", "世界。", "你好。世界。"), ("Hello", "世界", "Hello世界"), ("", "New.", "New.")])
def test_the_transcript_and_the_new_text_join_as_upstream_writes_them(transcript, text, joined):
    assert join_transcript(transcript, text) == joined


def test_prompt_text_is_the_transcript_before_the_text(tts):
    prompt = Reference(np.random.default_rng(9).integers(0, 64, size=(6, N_VQ)))
    kw = dict(options=DelaySamplingOptions().greedy(),
              max_new_rows=12)
    a = list(tts.stream("New words.", prompt=prompt, prompt_text="Prompt words.", **kw))
    b = list(tts.stream("Prompt words. New words.", prompt=prompt, **kw))
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(InputError, match="transcript of the prompt audio"):
        next(tts.stream("New words.", prompt_text="Prompt words.", **kw))
