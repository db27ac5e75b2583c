"""NanoTTS (moss_tts/models/nano_tts.py): greedy generation against the float64 reference
generation loop (fixtures/reference/nano.py generate_greedy) in every prompt mode, the stop
decision, seeds, streaming vs offline decode, long-text chunks and their pauses, the frame budget,
and the load-time checks. Tiny Nano models (tests/models/conftest.py) with the tiny 1600 Hz
stereo codec; everything through the real converters and loaders."""

import itertools
import logging
import tracemalloc
import warnings

import numpy as np
import pytest

from fixtures.compare import assert_close, assert_differs
from fixtures.reference import nano as ref
from moss_tts.audio import REFERENCE_MAX_SECONDS
from moss_tts.errors import BudgetWarning, InputError, ModelFileError
from moss_tts.models.nano_tts import MAX_FRAMES, MIN_FRAMES, NanoTTS, Reference, frame_budget
from moss_tts.sampling import SamplingOptions
from moss_tts.text import pause_samples

from .conftest import AUDIO_VOCAB, N_VQ, SAMPLE_RATE, THREADS, seeded_codes

# The codec's streaming decoder vs its offline decode: the same f32 graphs over different cache
# fillings (tests/codec/test_streaming.py measured ≤ 4e-6; here ≤ 3e-6).
STREAM_ATOL = 1e-5
SAMPLES_PER_FRAME = 32   # the tiny stereo codec: 1600 Hz / 50 Hz frames, per channel

# seed 0 models (fixtures.make_nano): stop_bias −2 stops on its own in some prompts and runs to
# the frame limit in others; ±50 force stop / continue at every frame.
PARITY, NEVER_STOPS, STOPS_AT_ONCE = (0, -2.0), (0, -50.0), (0, 50.0)
PARITY_FRAMES = 24
TEXT = "The speaker reads a short sentence."
LONG_TEXT = ("The speaker reads a short sentence aloud. Hello there. "
             "My friend hears the long story today. Yes.")
GREEDY = SamplingOptions(do_sample=False, audio_repetition_penalty=1.0)


def request(mode):
    """plan() keywords of the three prompt modes (docs/upstream-notes.md §nano-5.3)."""
    if mode == "voice_clone":
        return {"reference": Reference(seeded_codes(6, seed=1))}
    if mode == "continuation":
        return {}
    return {"prompt_text": "Hello there.", "prompt": Reference(seeded_codes(5, seed=2))}


MODES = ["voice_clone", "continuation", "continuation_with_prompt"]


def single_prompt(tts, mode, text=TEXT):
    plan = tts.plan(text, **request(mode))
    assert len(plan) == 1
    return plan[0][1]


# --- greedy parity -----------------------------------------------------------------------------


@pytest.mark.parametrize("penalty", [1.0, 1.2], ids=["no_penalty", "penalty_1.2"])
@pytest.mark.parametrize("mode", MODES)
def test_greedy_generation_matches_reference(nano_tts, nano_reference, mode, penalty):
    tts = nano_tts(*PARITY)
    state, cfg = nano_reference(*PARITY)
    rows = single_prompt(tts, mode)
    options = SamplingOptions(do_sample=False, audio_repetition_penalty=penalty)
    got = tts.generate(rows, options=options, seed=0, max_frames=PARITY_FRAMES)
    want = ref.generate_greedy(state, cfg, rows, PARITY_FRAMES, repetition_penalty=penalty)
    assert got.dtype == np.int32 and got.shape[1] == N_VQ
    assert len(want) > 0, "the reference stops at once: the comparison would be vacuous"
    np.testing.assert_array_equal(got, want, err_msg=f"{mode}, penalty {penalty}")
    if penalty != 1.0:
        # guard: greedy decoding still applies the penalty, and here it changes the codes
        plain = ref.generate_greedy(state, cfg, rows, PARITY_FRAMES)
        assert plain.shape != want.shape or (plain != want).any(), \
            "the penalty changes nothing for this prompt: the check would be vacuous"


def test_parity_prompts_cover_natural_stops_and_full_runs(nano_tts, nano_reference):
    """The parity cases above include runs the model stops itself and runs cut by max_frames,
    and every mode's prompt is different."""
    tts = nano_tts(*PARITY)
    state, cfg = nano_reference(*PARITY)
    lengths = [len(ref.generate_greedy(state, cfg, single_prompt(tts, m), PARITY_FRAMES,
                                       repetition_penalty=p))
               for m in MODES for p in (1.0, 1.2)]
    assert min(lengths) < PARITY_FRAMES and max(lengths) == PARITY_FRAMES, lengths
    prompts = [single_prompt(tts, m) for m in MODES]
    assert len({p.tobytes() for p in prompts}) == len(MODES)


def test_prompt_rows_carry_reference_and_prompt_codes_with_their_slots(nano_tts):
    tts = nano_tts(*PARITY)
    clone = single_prompt(tts, "voice_clone")
    codes = request("voice_clone")["reference"].codes
    audio = clone[clone[:, 0] == 8]
    np.testing.assert_array_equal(audio[:, 1:], codes)
    prompt = single_prompt(tts, "continuation_with_prompt")
    prompt_codes = request("continuation_with_prompt")["prompt"].codes
    np.testing.assert_array_equal(prompt[-5:, 1:], prompt_codes)
    assert (prompt[-5:, 0] == 9).all() and prompt[-6, 0] == 6
    assert clone[-1, 0] == 6 and (clone[-1, 1:] == AUDIO_VOCAB).all()


# --- stop decision -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_stop_bias_plus_50_generates_no_frame(nano_tts, nano_reference, mode):
    tts = nano_tts(*STOPS_AT_ONCE)
    rows = single_prompt(tts, mode)
    assert tts.generate(rows, options=GREEDY, max_frames=10).shape == (0, N_VQ)
    assert tts.generate(rows, seed=0, max_frames=10).shape == (0, N_VQ)  # sampled
    assert len(ref.generate_greedy(*nano_reference(*STOPS_AT_ONCE), rows, 10)) == 0
    with pytest.raises(InputError, match="no audio was made: the model ended the speech"):
        tts.synthesize(TEXT, seed=0, **request(mode))     # never 0 samples (issue 22 #6)


@pytest.mark.parametrize("mode", MODES)
def test_stop_bias_minus_50_runs_to_max_frames(nano_tts, mode):
    tts = nano_tts(*NEVER_STOPS)
    rows = single_prompt(tts, mode)
    assert tts.generate(rows, options=GREEDY, max_frames=17).shape == (17, N_VQ)
    assert tts.generate(rows, seed=5, max_frames=17).shape == (17, N_VQ)


# --- seeds and streaming -----------------------------------------------------------------------


def test_streaming_matches_offline_decode_for_the_same_seed(nano_tts):
    tts = nano_tts(*PARITY)
    kw = request("voice_clone")
    parts = list(tts.stream(TEXT, seed=3, max_frames=20, **kw))
    frames = tts.generate(single_prompt(tts, "voice_clone"), seed=3, max_frames=20)
    assert len(frames) >= 2, "too few frames to compare a stream"
    assert len(parts) == len(frames), "one streamed block per generated frame"
    assert all(p.shape == (SAMPLES_PER_FRAME, 2) and p.dtype == np.float32 for p in parts)
    offline = tts.codec.decode(frames.T, n_quantizers=N_VQ)
    assert_close(np.concatenate(parts), offline, atol=STREAM_ATOL, what="stream vs offline")
    assert_close(tts.synthesize(TEXT, seed=3, max_frames=20, **kw)[0], offline,
                 atol=STREAM_ATOL, what="synthesize vs offline")


def test_same_seed_same_audio_and_different_seed_different_audio(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    kw = dict(max_frames=12, **request("voice_clone"))
    a, _ = tts.synthesize(TEXT, seed=3, **kw)
    b, _ = tts.synthesize(TEXT, seed=3, **kw)
    c, _ = tts.synthesize(TEXT, seed=4, **kw)
    np.testing.assert_array_equal(a, b)
    assert_differs(c, a, atol=STREAM_ATOL, what="seed 4 vs seed 3")
    rows = single_prompt(tts, "voice_clone")
    codes_3 = tts.generate(rows, seed=3, max_frames=12)
    assert (codes_3 != tts.generate(rows, seed=4, max_frames=12)).any()


def test_generation_state_reused_across_utterances_starts_clean(nano_files, codec_gguf):
    """The last utterance's generation state (caches, built graphs) serves the next one when it
    is large enough, reset: results equal a fresh instance's, whatever ran before, and an
    abandoned stream still hands its state back."""
    _, gguf = nano_files(*NEVER_STOPS)
    with NanoTTS.load(gguf, codec=codec_gguf, threads=THREADS) as tts, \
            NanoTTS.load(gguf, codec=codec_gguf, threads=THREADS) as fresh:
        short = single_prompt(tts, "voice_clone")
        longer = single_prompt(tts, "voice_clone", text=LONG_TEXT[:90])
        first = tts.generate(short, seed=5, max_frames=10)
        state = tts._idle_state
        assert state is not None and state.position > 0
        again = tts.generate(short, seed=5, max_frames=10)
        assert tts._idle_state is state, "a large enough idle state was not reused"
        np.testing.assert_array_equal(again, first)
        big = tts.generate(longer, seed=6, max_frames=300)       # needs a larger state
        assert tts._idle_state.capacity >= len(longer) + 300
        np.testing.assert_array_equal(big, fresh.generate(longer, seed=6, max_frames=300))
        np.testing.assert_array_equal(tts.generate(short, seed=5, max_frames=10), first)
        frames = tts.iter_frames(short, seed=5, max_frames=10)
        next(frames)
        assert tts._idle_state is None, "a running utterance must own its state"
        frames.close()                                            # abandoned mid-utterance
        assert tts._idle_state is not None
        np.testing.assert_array_equal(tts.generate(short, seed=5, max_frames=10), first)
        # the reset is what makes reuse clean: a prompt prefilled into the used state without
        # it (after the stale rows) differs from a new state's; after it, it is the same
        state, new = tts._idle_state, fresh.model.make_state(len(short))
        want = fresh.model.prefill(new, short)
        new.close()
        assert_differs(tts.model.prefill(state, short), want, atol=1e-4, what="no reset")
        state.reset()
        np.testing.assert_array_equal(tts.model.prefill(state, short), want)


def test_continuation_audio_continues_the_prompt_codec_stream(nano_tts):
    """With prompt codes the codec stream starts from the prompt; its audio is not returned."""
    tts = nano_tts(*NEVER_STOPS)
    kw = request("continuation_with_prompt")
    audio, _ = tts.synthesize(TEXT, seed=2, max_frames=9, **kw)
    frames = tts.generate(single_prompt(tts, "continuation_with_prompt"), seed=2, max_frames=9)
    prompt = kw["prompt"].codes
    whole = tts.codec.decode(np.concatenate([prompt, frames]).T, n_quantizers=N_VQ)
    assert_close(audio, whole[len(prompt) * SAMPLES_PER_FRAME:], atol=STREAM_ATOL,
                 what="continuation after the prompt")
    assert_differs(audio, tts.codec.decode(frames.T, n_quantizers=N_VQ), atol=STREAM_ATOL,
                   what="decoded without the prompt context")


# --- long text ---------------------------------------------------------------------------------


def test_long_voice_clone_text_is_chunked_with_pauses(nano_tts):
    """Each chunk: its own prompt with the same reference, frames, decode; then 0.24 s (more
    than four words) or 0.40 s of zeros after every chunk but the last (docs/upstream-notes.md
    §nano-5.4-5.5)."""
    tts = nano_tts(*NEVER_STOPS)
    kw = dict(max_text_tokens=20, **request("voice_clone"))
    plan = tts.plan(LONG_TEXT, **kw)
    pauses = [pause_samples(chunk, SAMPLE_RATE) for chunk, _ in plan[:-1]]
    assert len(plan) >= 3 and set(pauses) == {round(0.24 * SAMPLE_RATE), round(0.40 * SAMPLE_RATE)}
    reference = kw["reference"].codes
    expected, spans, at = [], [], 0
    for i, (chunk, rows) in enumerate(plan):
        np.testing.assert_array_equal(rows[rows[:, 0] == 8, 1:], reference)
        frames = tts.generate(rows, options=GREEDY, max_frames=5)
        expected.append(tts.codec.decode(frames.T, n_quantizers=N_VQ))
        at += len(expected[-1])
        if i < len(pauses):
            expected.append(np.zeros((pauses[i], 2), np.float32))
            spans.append((at, at + pauses[i]))
            at += pauses[i]
    audio, _ = tts.synthesize(LONG_TEXT, options=GREEDY, max_frames=5, **kw)
    assert len(audio) == len(plan) * 5 * SAMPLES_PER_FRAME + sum(pauses)
    assert_close(audio, np.concatenate(expected), atol=STREAM_ATOL, what="chunks with pauses")
    for start, stop in spans:
        assert not audio[start:stop].any(), "a pause holds non-zero samples"
        assert audio[start - SAMPLES_PER_FRAME:start].any()   # speech on both sides
        assert audio[stop:stop + SAMPLES_PER_FRAME].any()


@pytest.mark.parametrize("mode", MODES)
def test_long_text_is_chunked_in_every_mode(nano_tts, mode):
    """The same chunks in every mode; a continuation chunk after the first has no rows before
    generation (it is prompted by the chunk before it, as generated)."""
    tts = nano_tts(*NEVER_STOPS)
    plan = tts.plan(LONG_TEXT, max_text_tokens=10, **request(mode))
    clone = tts.plan(LONG_TEXT, max_text_tokens=10, **request("voice_clone"))
    assert len(plan) > 2 and [c for c, _ in plan] == [c for c, _ in clone]
    assert all(len(tts.tokenizer.encode(c)) <= 10 for c, _ in plan)
    known = [rows is not None for _, rows in plan]
    assert known == [True] * len(plan) if mode == "voice_clone" else known[1:] == [False] * (
        len(plan) - 1) and known[0]


@pytest.mark.parametrize("mode", ["continuation", "continuation_with_prompt"])
def test_continuation_chunks_are_prompted_by_the_chunk_before(nano_tts, mode):
    """Chunk i+1's prompt is chunk i's text and generated codes (upstream's continuation with a
    prompt), and one codec stream runs through the request: the audio is the decode of the
    prompt and every chunk's frames, the prompt cut off, with the pauses spliced in."""
    tts = nano_tts(*NEVER_STOPS)
    kw = dict(options=GREEDY, max_frames=5, max_text_tokens=10, **request(mode))
    chunks, prompt_text = tts.split_text(LONG_TEXT, prompt_text=kw.get("prompt_text"),
                                         max_text_tokens=10)
    prompt = kw.get("prompt")
    codes, pauses = [] if prompt is None else [prompt.codes], []
    independent = []
    for i, chunk in enumerate(chunks):
        rows = tts.prompt_rows(chunk, prompt_text=prompt_text, prompt=prompt)
        frames = tts.generate(rows, options=GREEDY, max_frames=5)
        if prompt is not None:   # the carried codes close the prompt, in assistant-slot rows
            np.testing.assert_array_equal(rows[-len(prompt.codes):, 1:], prompt.codes)
            assert (rows[-len(prompt.codes):, 0] == 9).all()
        independent.append(tts.generate(tts.prompt_rows(chunk), options=GREEDY, max_frames=5))
        codes.append(frames)
        prompt_text, prompt = chunk + " ", Reference(frames)
        pauses.append(pause_samples(chunk, SAMPLE_RATE) if i + 1 < len(chunks) else 0)
    audio, _ = tts.synthesize(LONG_TEXT, **kw)
    whole = tts.codec.decode(np.concatenate(codes).T, n_quantizers=N_VQ)
    at = 0 if "prompt" not in kw else len(kw["prompt"].codes) * SAMPLES_PER_FRAME
    expected = []
    for frames, pause in zip(codes[len(codes) - len(chunks):], pauses):
        n = len(frames) * SAMPLES_PER_FRAME
        expected += [whole[at:at + n], np.zeros((pause, 2), np.float32)]
        at += n
    assert_close(audio, np.concatenate(expected), atol=STREAM_ATOL, what="carried continuation")
    # guard: prompting each chunk by the one before changes what the model says
    carried = codes[len(codes) - len(chunks):]
    assert any(a.shape != b.shape or (a != b).any() for a, b in zip(carried[1:], independent[1:]))


def test_a_cut_at_the_frame_budget_is_one_warning_per_call(nano_tts):
    chunks = len(nano_tts(*NEVER_STOPS).plan(LONG_TEXT, max_text_tokens=20))
    with pytest.warns(BudgetWarning) as seen:
        nano_tts(*NEVER_STOPS).synthesize(LONG_TEXT, seed=0, max_frames=6, max_text_tokens=20)
    cuts = [w for w in seen if issubclass(w.category, BudgetWarning)]
    assert len(cuts) == 1 and chunks > 1
    assert str(cuts[0].message).startswith(f"{chunks} of {chunks} text chunk(s)")
    assert "(6 frames" in str(cuts[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetWarning)     # a model that stops is not cut
        nano_tts(*PARITY).synthesize(TEXT, seed=0)


def test_a_cut_by_its_texts_budget_names_that_bound_not_max_frames(nano_tts):
    """Issue 31 (finding 9): a chunk cut at the budget its text sets (below max_frames) was
    told to "raise max_frames", which cannot move it; the warning now says what set the budget
    and that no knob raises it (its `keyword` None: no front end spells a flag to raise)."""
    tts = nano_tts(*NEVER_STOPS)
    (chunk, _), = tts.plan("Hi.")
    budget = frame_budget(len(tts.tokenizer.encode(chunk)))
    assert budget < MAX_FRAMES
    with pytest.warns(BudgetWarning) as seen:
        tts.synthesize("Hi.", seed=0)
    (cut,) = [w.message for w in seen if issubclass(w.category, BudgetWarning)]
    assert "raise max_frames" not in str(cut) and cut.keyword is None
    assert f"({budget} frames" in str(cut)
    assert "set by its text's length (6 frames per text token + 50, at least 64), which no " \
           "knob raises" in str(cut)
    # guard: a cut at max_frames still advises raising it
    with pytest.warns(BudgetWarning) as seen:
        tts.synthesize("Hi.", seed=0, max_frames=budget - 1)
    (cut,) = [w.message for w in seen if issubclass(w.category, BudgetWarning)]
    assert str(cut).endswith("raise max_frames") and cut.keyword == "max_frames"


def test_a_warning_over_chunks_cut_by_both_bounds_counts_each(nano_tts):
    """Some chunks cut at max_frames, others below it at their text's budget: each bound is
    named with its count."""
    tts = nano_tts(*NEVER_STOPS)
    budgets = sorted(frame_budget(len(tts.tokenizer.encode(chunk)))
                     for chunk, _ in tts.plan(LONG_TEXT, max_text_tokens=8))
    cap = budgets[len(budgets) // 2]
    below = sum(b < cap for b in budgets)
    assert 0 < below < len(budgets)
    with pytest.warns(BudgetWarning) as seen:
        tts.synthesize(LONG_TEXT, seed=0, max_frames=cap, max_text_tokens=8)
    (cut,) = [w.message for w in seen if issubclass(w.category, BudgetWarning)]
    assert f"— {len(budgets) - below} at max_frames (raise max_frames), {below} at the " \
           "budget set by its text's length" in str(cut)
    assert cut.keyword == "max_frames"


HUGE_TEXT_CHARS = 100_000


@pytest.mark.parametrize("mode", ["voice_clone", "continuation"])
def test_100k_characters_plan_in_bounded_prompts(nano_tts, mode):
    """Every prompt is one chunk's (no [L, L] mask over the whole text), and planning 100k
    characters allocates little: the chunks' texts and small row arrays."""
    tts = nano_tts(*NEVER_STOPS)
    text = (LONG_TEXT + " ") * (HUGE_TEXT_CHARS // (len(LONG_TEXT) + 1))
    tracemalloc.start()
    try:
        plan = tts.plan(text, **request(mode))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rows = [r for _, r in plan if r is not None]
    assert len(plan) > 100 and max(len(r) for r in rows) < 400
    assert peak < 64 * 2**20, f"planning peaked at {peak / 2**20:.0f} MiB"


def test_a_long_continuation_keeps_its_generation_state_bounded(nano_files, codec_gguf):
    """Chunk after chunk of a long text, the prompt (the chunk before) and the generation
    state stay the size of one chunk's (a fresh instance: no larger state kept from before)."""
    _, gguf = nano_files(*NEVER_STOPS)
    text = (LONG_TEXT + " ") * 200
    with NanoTTS.load(gguf, codec=codec_gguf, threads=THREADS) as tts:
        parts = list(itertools.islice(tts.stream(text, seed=1, max_frames=8, max_text_tokens=10),
                                      200))
        assert sum(len(p) for p in parts) > 0
        assert tts._idle_state.capacity <= 256, tts._idle_state.capacity


# --- frame budget -------------------------------------------------------------------------------


def test_frame_budget_scales_with_text_length_under_the_cap():
    budgets = [frame_budget(n) for n in range(400)]
    assert all(b >= MIN_FRAMES for b in budgets) and max(budgets) == MAX_FRAMES
    assert all(a <= b for a, b in itertools.pairwise(budgets)), "not monotonic"
    assert frame_budget(40) > frame_budget(10) > frame_budget(0)
    assert frame_budget(10**6) == MAX_FRAMES
    assert frame_budget(40, cap=7) == 7 and frame_budget(0, cap=7) == 7


def test_synthesis_frames_follow_the_budget_and_the_cap(nano_tts):
    """A model that never stops fills exactly the budget of its text; max_frames caps it."""
    tts = nano_tts(*NEVER_STOPS)
    counts = {}
    for text in ("Hi.", LONG_TEXT):
        (chunk, _), = tts.plan(text)
        audio, _ = tts.synthesize(text, seed=0)
        counts[text] = len(audio) // SAMPLES_PER_FRAME
        assert len(audio) % SAMPLES_PER_FRAME == 0
        assert counts[text] == frame_budget(len(tts.tokenizer.encode(chunk))), text
    assert counts[LONG_TEXT] > counts["Hi."]
    capped, _ = tts.synthesize(LONG_TEXT, seed=0, max_frames=7)
    assert len(capped) == 7 * SAMPLES_PER_FRAME


# --- load-time checks and inputs -----------------------------------------------------------------


def test_mismatched_codec_raises_model_file_error(nano_files, v1_codec_gguf):
    _, gguf = nano_files(*PARITY)
    with pytest.raises(ModelFileError, match="mismatched codec"):
        NanoTTS.load(gguf, codec=v1_codec_gguf, threads=THREADS)


def test_gguf_of_another_kind_as_model_raises_model_file_error(codec_gguf):
    with pytest.raises(ModelFileError, match="expected a nano GGUF"):
        NanoTTS.load(codec_gguf, threads=THREADS)


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_text_raises_input_error(nano_tts, text):
    tts = nano_tts(*PARITY)
    with pytest.raises(InputError, match="empty"):
        tts.synthesize(text, seed=0)
    with pytest.raises(InputError, match="empty"):
        tts.plan(text, **request("voice_clone"))


def test_synthesis_without_codec_raises_input_error(nano_files):
    _, gguf = nano_files(*PARITY)
    with NanoTTS.load(gguf, threads=THREADS) as tts, pytest.raises(InputError, match="codec"):
        tts.synthesize(TEXT, seed=0)


def test_synthesize_returns_finite_stereo_float32_at_the_codec_rate(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    audio, sr = tts.synthesize(TEXT, seed=1, max_frames=10, **request("voice_clone"))
    assert sr == SAMPLE_RATE == tts.sample_rate
    assert audio.dtype == np.float32 and audio.shape == (10 * SAMPLES_PER_FRAME, 2)
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0


def test_a_long_reference_is_cut_to_the_limit_with_a_warning(nano_tts, caplog):
    """A voice needs seconds: past REFERENCE_MAX_SECONDS the reference is cut (and said so),
    its first 30 s give the same codes as a 30 s reference; a continuation prompt is kept."""
    tts = nano_tts(*NEVER_STOPS)
    rng = np.random.default_rng(12)
    long = (0.1 * rng.standard_normal((SAMPLE_RATE * 40, 2))).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="moss_tts.audio"):
        voice = tts.encode_reference(long, SAMPLE_RATE)
    frames = int(REFERENCE_MAX_SECONDS * SAMPLE_RATE) // SAMPLES_PER_FRAME
    assert voice.codes.shape == (frames, N_VQ)
    assert "40.0 s long; using its first 30 s" in caplog.text
    cut = tts.encode_reference(long[: int(REFERENCE_MAX_SECONDS * SAMPLE_RATE)], SAMPLE_RATE)
    np.testing.assert_array_equal(voice.codes, cut.codes)
    whole = tts.encode_reference(long, SAMPLE_RATE, max_seconds=None)
    assert whole.codes.shape == (40 * SAMPLE_RATE // SAMPLES_PER_FRAME, N_VQ)


def test_encode_reference_gives_frames_by_codebooks(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    rng = np.random.default_rng(11)
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    mono = 0.3 * np.sin(2 * np.pi * 110 * t) + 0.05 * rng.standard_normal(t.size)
    mono = mono.astype(np.float32)
    voice = tts.encode_reference(mono, SAMPLE_RATE)
    assert voice.codes.shape == (SAMPLE_RATE // SAMPLES_PER_FRAME, N_VQ)
    assert np.issubdtype(voice.codes.dtype, np.integer)
    assert ((voice.codes >= 0) & (voice.codes < AUDIO_VOCAB)).all()
    assert len(np.unique(voice.codes)) > 1
    # mono is duplicated to stereo
    stereo = tts.encode_reference(np.stack([mono, mono], axis=1), SAMPLE_RATE)
    np.testing.assert_array_equal(stereo.codes, voice.codes)
    audio, _ = tts.synthesize(TEXT, reference=voice, seed=0, max_frames=4)
    assert audio.shape == (4 * SAMPLES_PER_FRAME, 2)


# --- API arguments (issue 11: these were bare TypeError / ValueError / AttributeError) -------


def clip(seconds=1.0, seed=11):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * 110 * t) + 0.05 * rng.standard_normal(t.size)).astype(
        np.float32)


BAD_ARGUMENTS = {
    "reference as a path": (dict(reference="speaker.wav"), "cannot be a str"),
    "reference as float samples": (dict(reference=clip()), "looks like audio"),
    "reference as codec-layout codes": (dict(reference=seeded_codes(50, seed=1).T),
                                        "transpose"),
    "reference codes too narrow": (dict(reference=seeded_codes(7, seed=1)[:, :2]),
                                   r"shape \[frames, 4\]"),
    "reference as a 1-tuple": (dict(reference=(clip(),)), "tuple must be"),
    "reference audio without a rate": (dict(reference=(clip(), None)), "sample_rate"),
    "reference as a list of words": (dict(reference=["a", "b"]), "codes must be integers"),
    "prompt as a path": (dict(prompt="p.wav", prompt_text="Hi."), "prompt cannot be a str"),
    "options as a dict": (dict(options={"do_sample": False}), r"SamplingOptions\(\*\*options\)"),
    "seed -1": (dict(seed=-1), "seed must be at least 0"),        # the knob table's words
    "seed 'a'": (dict(seed="a"), "seed must be an integer"),
    "seed 1.5": (dict(seed=1.5), "seed must be a whole number"),
    "max_frames 0": (dict(max_frames=0), "max_frames"),
    "max_frames '9'": (dict(max_frames="9"), "max_frames"),
    "max_text_tokens 0": (dict(max_text_tokens=0), "max_text_tokens"),
    "max_text_tokens huge": (dict(max_text_tokens=10**6), "max_text_tokens"),
    "prompt_text as bytes": (dict(prompt_text=b"Hi.", prompt=Reference(seeded_codes(3, seed=2))),
                             "prompt_text must be a str"),
    "voice clone with a prompt": (dict(reference=Reference(seeded_codes(3, seed=1)),
                                       prompt_text="Hi.", prompt=Reference(seeded_codes(3, seed=2))),
                                  "voice_clone mode takes no prompt"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_arguments_raise_one_line_input_errors_before_any_audio(nano_tts, case):
    tts = nano_tts(*NEVER_STOPS)
    kwargs, match = BAD_ARGUMENTS[case]
    with pytest.raises(InputError, match=match) as e:
        tts.stream(TEXT, **kwargs)              # raised by the call, not at the first chunk
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=match):
        tts.synthesize(TEXT, **kwargs)


@pytest.mark.parametrize("text, match", [(b"Hello.", "got bytes: decode it first"),
                                         (42, "text must be a str, got int"), (None, "got NoneType")])
def test_text_that_is_not_a_str_is_named_as_such(nano_tts, text, match):
    with pytest.raises(InputError, match=match):
        nano_tts(*NEVER_STOPS).synthesize(text)


def test_iter_frames_checks_its_arguments(nano_tts):
    tts = nano_tts(*NEVER_STOPS)
    rows = single_prompt(tts, "voice_clone")
    for kwargs in ({"seed": -1}, {"options": {}}, {"max_frames": 2.5}):
        with pytest.raises(InputError):
            tts.generate(rows, **kwargs)


def test_a_reference_may_be_audio_codes_or_a_stored_voice(nano_tts, tmp_path):
    """(samples, sample_rate) is encoded; codes [frames, n_vq] are used as they are, and a
    voice stored as `voice add` does (all the codec's codebooks) gives its first n_vq."""
    import moss_tts
    from moss_tts.voices import add_voice

    tts = nano_tts(*NEVER_STOPS)
    voice = tts.encode_reference(clip(), SAMPLE_RATE)
    want, _ = tts.synthesize(TEXT, reference=voice, seed=0, max_frames=4)
    got, _ = tts.synthesize(TEXT, reference=(clip(), SAMPLE_RATE), seed=0, max_frames=4)
    np.testing.assert_array_equal(got, want)
    got, _ = tts.synthesize(TEXT, reference=voice.codes.astype(np.int64), seed=0, max_frames=4)
    np.testing.assert_array_equal(got, want)
    stored = tts.codec.encode(clip(), SAMPLE_RATE).T            # [frames, 8]: as `voice add`
    assert stored.shape[1] == tts.codec.n_quantizers > N_VQ
    add_voice("alice", stored, {"source": "test"}, root=tmp_path)
    codes = moss_tts.load_voice("alice", root=tmp_path)[0].codes
    got, _ = tts.synthesize(TEXT, reference=codes, seed=0, max_frames=4)
    np.testing.assert_array_equal(got, want)
    other, _ = tts.synthesize(TEXT, reference=seeded_codes(len(codes), seed=9), seed=0,
                              max_frames=4)
    assert_differs(other, want, atol=STREAM_ATOL, what="another voice")   # guard
    assert moss_tts.Reference is Reference and "Reference" in moss_tts.__all__


def test_a_closed_nano_tts_raises_input_error(nano_files, codec_gguf):
    _, gguf = nano_files(*PARITY)
    tts = NanoTTS.load(gguf, codec=codec_gguf, threads=THREADS)
    tts.close()
    for call in (lambda: tts.synthesize(TEXT), lambda: tts.plan(TEXT),
                 lambda: tts.encode_reference(clip(), SAMPLE_RATE)):
        with pytest.raises(InputError, match="closed"):
            call()
