"""LocalTTS (models/local_tts.py) with the tiny Local model and the tiny 24 kHz-style (v1)
codec: prompts by ids == upstream's string route without delay (§family-3.5); streamed audio ==
synthesize() == the offline decode of the generated frames (the audio-end row's frame
included, P9) for any chunking, the adaptive ladder, n_vq_for_inference, continuation, voice
cloning through the codec; bad input."""

import numpy as np
import pytest

from fixtures.compare import assert_close
from fixtures.make_delay import SAMPLE_RATE, make_tokenizer_json
from fixtures.make_local import END, GEN, N_VQ, tiny_config
from fixtures.reference import delay as delay_ref
from moss_tts.errors import InputError, ModelFileError
from moss_tts.models.local_tts import LocalTTS
from moss_tts.sampling import LocalSamplingOptions
from moss_tts.models.tts import TTS, Reference
from tests.models.local_fixtures import THREADS

# the codec's streaming decoder equals its offline decode up to f32 kernel order (codecs tests)
DECODE_ATOL = 1e-5
GREEDY = LocalSamplingOptions().greedy()
HOP = 64                                  # the tiny v1 codec: samples per frame


@pytest.fixture(scope="module")
def tts(local_files, v1_codec_gguf):
    t = LocalTTS.load(local_files(1, speech=True)[3], codec=v1_codec_gguf, threads=THREADS)
    yield t
    t.close()


def offline(tts, text, n_vq=None, **kw):
    """Decode the generated rows' codes at once (every row is a frame, the last one too)."""
    kw["max_new_frames"] = kw.pop("max_frames")
    rows = tts.model.generate(tts.plan(text), n_vq_for_inference=n_vq, **kw)
    n = n_vq or N_VQ
    return tts.codec.decode(rows[:, 1:1 + n].T, n_quantizers=n), rows


@pytest.mark.parametrize("options, seed, chunk", [
    (GREEDY, None, 0), (GREEDY, None, 1), (GREEDY, None, 3), (LocalSamplingOptions(), 7, 0)],
    ids=["greedy_adaptive", "greedy_1", "greedy_3", "sampled_adaptive"])
def test_stream_equals_synthesize_equals_offline_decode(tts, options, seed, chunk):
    text = "Hello there."
    kw = dict(options=options, seed=seed, max_frames=12)
    chunks = list(tts.stream(text, chunk_frames=chunk, **kw))
    audio, sr = tts.synthesize(text, chunk_frames=chunk, **kw)
    assert sr == SAMPLE_RATE and audio.shape[1] == 1
    # the ladder follows the clock, so adaptive chunks may differ between runs; the tiny f32
    # codec's stream gives the same samples whatever the grouping
    np.testing.assert_array_equal(np.concatenate(chunks), audio)
    want, rows = offline(tts, text, **kw)
    assert len(audio) == len(rows) * HOP
    assert_close(audio, want, atol=DECODE_ATOL, what="streamed vs offline decode")
    if chunk:
        assert [len(c) for c in chunks[:-1]] == [chunk * HOP] * (len(chunks) - 1)


def test_the_audio_end_row_is_decoded_as_a_trailing_frame(tts):
    """P9: the row whose text token is audio_end still carries sampled codes; they are the
    last frame of the audio."""
    audio, _ = tts.synthesize("Hi.", options=GREEDY, max_frames=12)
    _, rows = offline(tts, "Hi.", options=GREEDY, max_frames=12)
    assert rows[-1, 0] == END and (rows[:-1, 0] == GEN).all()
    assert len(audio) == len(rows) * HOP
    without = tts.codec.decode(rows[:-1, 1:].T)
    assert len(without) < len(audio)


def test_adaptive_chunks_start_with_four_frames(tts):
    chunks = list(tts.stream("Hello there.", options=GREEDY, max_frames=12))
    if len(chunks) > 1:
        assert len(chunks[0]) == 4 * HOP


def test_fewer_codebooks_generate_and_decode_that_many(tts):
    audio, _ = tts.synthesize("Hello there.", options=GREEDY, max_frames=8,
                              n_vq_for_inference=2)
    want, rows = offline(tts, "Hello there.", n_vq=2, options=GREEDY, max_frames=8)
    assert (rows[:, 3:] == 0).all()
    assert_close(audio, want, atol=DECODE_ATOL, what="n_vq 2")
    full, _ = tts.synthesize("Hello there.", options=GREEDY, max_frames=8)
    assert full.shape != audio.shape or not np.array_equal(full, audio)


@pytest.mark.parametrize("with_reference", [False, True], ids=["no_reference", "voice_clone"])
def test_rows_by_ids_equal_upstreams_string_route_without_delay(tts, with_reference):
    codes = np.random.default_rng(2).integers(0, 64, size=(6, N_VQ)) if with_reference else None
    fields = dict(instruction="calm", tokens=38, language="English")
    got = tts.plan("Hello there, 你好。", reference=None if codes is None else Reference(codes),
                   **fields)
    want = delay_ref.prompt_rows_by_string(make_tokenizer_json(), tiny_config(),
                                           "Hello there, 你好。", codes, delayed=False,
                                           start_audio=True, **fields)
    np.testing.assert_array_equal(got, want)
    if with_reference:   # T user slots carrying the codes row for row, then AUDIO_END
        at = int(np.flatnonzero(got[:, 0] == tts.config.audio_start_token_id)[0])
        np.testing.assert_array_equal(got[at + 1:at + 7, 1:], codes)
        assert got[at + 7, 0] == tts.config.audio_end_token_id


def test_continuation_rows_equal_upstreams_truncated_assistant_turn(tts):
    codes = np.random.default_rng(5).integers(0, 64, size=(7, N_VQ))
    got = tts.plan("Prompt words. New words.", prompt=Reference(codes))
    want = delay_ref.prompt_rows_by_string(make_tokenizer_json(), tiny_config(),
                                           "Prompt words. New words.", prompt_codes=codes,
                                           delayed=False)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[-7:, 1:], codes)
    assert (got[-7:, 0] == GEN).all()


def test_continuation_stream_continues_the_prompt_audio(tts):
    """The prompt's frames prime the codec and their audio is dropped: the stream equals the
    offline decode of prompt + generated frames minus the prompt's samples (upstream trims the
    first segment by the same ratio)."""
    prompt = Reference(np.random.default_rng(9).integers(0, 64, size=(6, N_VQ)))
    got = np.concatenate(list(tts.stream("Prompt words. New words.", prompt=prompt,
                                         options=GREEDY, max_frames=10)))
    generated = tts.model.generate(tts.plan("Prompt words. New words.", prompt=prompt),
                                   options=GREEDY, max_new_frames=10)
    full = tts.codec.decode(np.vstack([prompt.codes, generated[:, 1:]]).T)
    assert_close(got, full[len(prompt.codes) * HOP:], atol=DECODE_ATOL,
                 what="continuation stream vs offline decode minus the prompt")
    # guard: without the priming the first frames decode differently
    alone = tts.codec.decode(generated[:, 1:].T)
    assert not np.allclose(got[:HOP], alone[:HOP], atol=DECODE_ATOL)


def test_voice_clone_reference_goes_through_the_codec_into_the_prompt(tts):
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    voice = tts.encode_reference(0.3 * np.sin(2 * np.pi * 220 * t), SAMPLE_RATE)
    assert voice.codes.shape == (len(t) // HOP, N_VQ)
    rows = tts.plan("Hi.", reference=voice)
    assert (rows[:, 0] == tts.config.audio_user_slot_token_id).sum() == len(voice.codes)
    audio, _ = tts.synthesize("Hi.", reference=voice, options=GREEDY, max_frames=8)
    plain, _ = tts.synthesize("Hi.", options=GREEDY, max_frames=8)
    assert audio.size and np.isfinite(audio).all()
    assert plain.shape != audio.shape or not np.array_equal(plain, audio)


def test_local_tts_offers_the_tts_protocol_and_research_steps(tts):
    assert isinstance(tts, TTS) and tts.channels == 1 and tts.sample_rate == SAMPLE_RATE
    rows = tts.plan("Hi.")
    hidden = tts.forward(rows)
    assert hidden.shape == (len(rows), 32)
    text, audio = tts.depth_logits(hidden[-1], [GEN, 1, 2])
    assert text.shape == (tiny_config()["language_config"]["vocab_size"],)
    assert audio.shape == (2, 65)
    np.testing.assert_array_equal(tts.generate(rows, options=GREEDY, max_new_frames=3),
                                  tts.model.generate(rows, options=GREEDY, max_new_frames=3))


def test_mismatched_codec_raises_model_file_error(local_files, codec_gguf):
    with pytest.raises(ModelFileError, match="mismatched codec: it is 1600 Hz x 2 channel"):
        LocalTTS.load(local_files()[3], codec=codec_gguf, threads=THREADS)


@pytest.mark.parametrize("text, match", [("", "text is empty"), ("  \n", "text is empty"),
                                         ("Say <|endoftext|>", "control token spelling"),
                                         ("Say <|im_end|>", "control token spelling")])
def test_bad_text_raises_input_error(tts, text, match):
    with pytest.raises(InputError, match=match):
        tts.synthesize(text)


@pytest.mark.parametrize("kwargs, match", [({"chunk_frames": -1}, "chunk_frames"),
                                           ({"chunk_frames": 1.5}, "chunk_frames"),
                                           ({"n_vq_for_inference": 9}, "n_vq_for_inference")])
def test_bad_stream_options_raise_input_error(tts, kwargs, match):
    with pytest.raises(InputError, match=match):
        tts.synthesize("Hi.", **kwargs)


def test_synthesis_without_codec_raises_input_error(local_files):
    with LocalTTS.load(local_files()[3], threads=THREADS) as t:
        with pytest.raises(InputError, match="no codec loaded"):
            t.synthesize("Hi.")
