"""The family contract the TTS base owns (moss_tts/models/tts.py, design §6, issue 22), checked alike on
the tiny checkpoint of every family: stored voices of another codec refused by name (finding 1),
text that is not clean Unicode refused as one InputError (3), every reference form for every
family and integer PCM scaled (4), the same InputError from every public method after close
(5), no audio as an error, one budget warning per call and budgets bounded before memory (6)."""

import inspect
import warnings

import numpy as np
import pytest

from moss_tts.batch.work import LineRunner
from moss_tts.codec import Codec
from moss_tts.errors import BudgetWarning, InputError
from moss_tts.live import live_chunks
from moss_tts.models.delay_tts import DelayTTS
from moss_tts.models.local_tts import LocalTTS
from moss_tts.models.local_v15_tts import LocalV15TTS
from moss_tts.models.nano_tts import NanoTTS
from moss_tts.models.realtime_tts import RealtimeTTS
from moss_tts.reference import codec_info
from moss_tts.models.tts import Reference, check_text
from moss_tts.voices import add_voice, load_voice

from .conftest import THREADS

FAMILIES = ["nano", "delay", "local", "local-v15", "realtime"]
CLASSES = {"nano": NanoTTS, "delay": DelayTTS, "local": LocalTTS, "local-v15": LocalV15TTS,
           "realtime": RealtimeTTS}
# a budget each tiny model speaks past (frames; Delay's rows include its 4-row staircase)
SMALL = {"nano": 6, "delay": 10, "local": 2, "local-v15": 6, "realtime": 3}
TEXT = "Hello there, quick brown foxes jump over lazy dogs."
TAKES_PROMPT = ("nano", "delay", "local", "local-v15")     # continuation prompts


@pytest.fixture(scope="module")
def files(nano_files, codec_gguf, delay_files, v1_codec_gguf, local_files, local_v15_files,
          realtime_files, v2_codec_gguf):
    """family → (model GGUF, codec GGUF) of a tiny model that speaks past SMALL (Realtime's
    speaks a frame per text token, then stops)."""
    return {"nano": (nano_files(0, -50.0)[1], codec_gguf),
            "delay": (delay_files(4.0)[3], v1_codec_gguf),
            "local": (local_files(1, speech=True)[3], v1_codec_gguf),
            "local-v15": (local_v15_files(6.0)[3], v2_codec_gguf),
            "realtime": (realtime_files(True)[2], v1_codec_gguf)}


def load(files, family):
    model, codec = files[family]
    return CLASSES[family].load(model, codec=codec, threads=THREADS)


@pytest.fixture(scope="module")
def loaded(files):
    made = {}

    def get(family):
        if family not in made:
            made[family] = load(files, family)
        return made[family]

    yield get
    for tts in made.values():
        tts.close()


def clip(tts, seconds=0.5, seed=11):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * tts.sample_rate)) / tts.sample_rate
    x = 0.3 * np.sin(2 * np.pi * 110 * t) + 0.05 * rng.standard_normal(t.size)
    return x.astype(np.float32), tts.sample_rate


def small(family) -> dict:
    return {CLASSES[family].BUDGET.keyword: SMALL[family]}


def speak(tts, family, **kw):
    """Reproducible audio of TEXT within the small budget (its cut warning is not the point;
    Local's fixed codec pushes, as its adaptive ones follow the clock)."""
    if family == "local":
        kw["chunk_frames"] = 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BudgetWarning)
        return tts.synthesize(TEXT, seed=3, **small(family), **kw)[0]


# --- finding 1: a stored voice of another codec is refused by name, wherever it enters ---------


@pytest.mark.parametrize("family", FAMILIES)
def test_f1_a_stored_voice_of_another_codec_is_refused_by_name(loaded, family, tmp_path):
    # the tiny Nano and v2 codecs are one codec (variant v2, 1600 Hz); the v1 codec differs
    tts = loaded(family)
    other = loaded("delay" if family in ("nano", "local-v15") else "nano")
    codes = np.zeros((5, tts.codec.n_quantizers), np.int32)
    add_voice("bob", codes, codec_info(other.codec), root=tmp_path)
    voice = load_voice("bob", root=tmp_path)
    refused = r"voice 'bob' does not fit this model: it was encoded with the \w+ codec"
    entries = [lambda: tts.voice("bob", root=tmp_path),
               lambda: tts.synthesize(TEXT, reference=voice[0]),
               lambda: tts.stream(TEXT, reference=voice)]
    if family in TAKES_PROMPT:
        entries.append(lambda: tts.stream(TEXT, prompt=voice[0], prompt_text="Hi."))
    if family == "realtime":
        entries.append(lambda: tts.session(voice=voice[0]))
    for entry in entries:
        with pytest.raises(InputError, match=refused):
            entry()
    # guard: the same codes recorded with this model's codec are taken
    add_voice("ann", codes, codec_info(tts.codec), root=tmp_path)
    assert tts.voice("ann", root=tmp_path).codes.shape == (5, tts.config.n_vq)


def test_f1_batch_refuses_a_stored_voice_of_another_codec(files, loaded, tmp_path):
    model, codec = files["nano"]
    add_voice("bob", np.zeros((5, 32), np.int32), codec_info(loaded("delay").codec),
              root=tmp_path)
    task = {"id": "e", "model": str(model), "codec": str(codec), "text": "Hi.", "voice": "bob",
            "voices_dir": tmp_path, "seed": 1, "options": {"max_frames": 4}, "suffix": ".wav"}
    runner = LineRunner(THREADS)
    try:
        outcome = runner.run(task)
    finally:
        runner.close()
    assert outcome["status"] == "failed" and outcome["retry"] is False
    assert "voice 'bob' does not fit this model" in outcome["error"]


# --- finding 3: text that is not clean Unicode is one InputError naming its field ---------------


def text_fields(family):
    cls = CLASSES[family]
    fields = list(cls.TEXT_FIELDS)
    return ["text"] + fields + (["prompt_text"] if family in TAKES_PROMPT else [])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bad, why", [
    ("Hi \udcff\udcfe.", "is not valid Unicode: a lone surrogate"),  # argv's undecodable bytes
    ("Hi\0there.", "holds a NUL character")], ids=["surrogate", "nul"])
def test_f3_text_that_is_not_clean_unicode_is_one_input_error(loaded, family, bad, why):
    tts = loaded(family)
    for field in text_fields(family):
        kw = {} if field == "text" else {field: bad}
        if field == "prompt_text":
            kw["prompt"] = np.zeros((3, tts.config.n_vq), np.int32)
        with pytest.raises(InputError, match=f"^{field} {why}"):
            tts.synthesize(bad if field == "text" else TEXT, **kw)
    assert check_text("Grüße, 你好") == "Grüße, 你好"      # guard: real Unicode passes


# --- finding 4: every reference form for every family; integer PCM scaled -----------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_f4_every_family_takes_every_reference_form(loaded, family, tmp_path):
    tts = loaded(family)
    samples, rate = clip(tts)
    ref = tts.encode_reference(samples, rate)
    assert type(ref) is Reference and ref.codec == codec_info(tts.codec)
    wider = np.hstack([ref.codes, np.zeros((len(ref.codes), 2), ref.codes.dtype)])
    add_voice("carol", wider, codec_info(tts.codec), root=tmp_path)  # as `voice add`: all books
    fields = ("reference", "prompt") if family in TAKES_PROMPT else ("reference",)
    for field in fields:
        extra = {"prompt_text": "Hi there."} if field == "prompt" else {}
        want = speak(tts, family, **{field: ref}, **extra)
        forms = {"codes": ref.codes.astype(np.int64), "audio": (samples, rate),
                 "loaded voice": load_voice("carol", root=tmp_path),
                 "its Reference": load_voice("carol", root=tmp_path)[0],
                 "tts.voice": tts.voice("carol", root=tmp_path)}
        for name, form in forms.items():
            got = speak(tts, family, **{field: form}, **extra)
            np.testing.assert_array_equal(got, want, err_msg=f"{field} as {name}")
    # guard: another voice changes the speech
    other = np.random.default_rng(5).integers(0, 8, size=ref.codes.shape)
    assert not np.array_equal(speak(tts, family, reference=other),
                              speak(tts, family, reference=ref))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["int16", "int32", "uint8"])
def test_f4_integer_pcm_is_scaled_to_full_scale_floats(loaded, family, dtype):
    tts = loaded(family)
    samples, rate = clip(tts)
    info = np.iinfo(dtype)
    scale = 2.0 ** (info.bits - 1)                # full scale: int16 32768, int32 2**31
    offset = scale if info.min == 0 else 0.0      # uint8 is offset binary: 128 is silence
    pcm = np.clip(np.round(samples * scale + offset), info.min, info.max).astype(dtype)
    assert len(np.unique(pcm)) > 100              # guard: real audio, not a clipped constant
    want = ((pcm.astype(np.float64) - offset) / scale).astype(np.float32)
    got = tts.encode_reference(pcm, rate).codes
    np.testing.assert_array_equal(got, tts.encode_reference(want, rate).codes)


# --- finding 5: after close, every public method raises the same InputError ----------------------


def calls(tts, family):
    """Each public method → a call with arguments it would take while open."""
    n = tts.config.n_vq
    rows, audio = np.zeros((3, n + 1), np.int64), clip(tts)
    hidden = np.zeros(8, np.float32)
    return {"synthesize": lambda: tts.synthesize(TEXT), "stream": lambda: tts.stream(TEXT),
            "encode_reference": lambda: tts.encode_reference(*audio),
            "plan": lambda: tts.plan(TEXT), "voice": lambda: tts.voice("bob"),
            "forward": lambda: tts.forward(rows), "generate": lambda: tts.generate(rows),
            "iter_frames": lambda: tts.iter_frames(rows),
            "split_text": lambda: tts.split_text(TEXT),
            "prompt_rows": lambda: tts.prompt_rows(TEXT),
            "depth_logits": lambda: tts.depth_logits(hidden, np.zeros(n, np.int64)),
            "local_logits": lambda: tts.local_logits(hidden, np.zeros(n, np.int64)),
            "session": lambda: tts.session(), "frame_audio": lambda: tts.frame_audio(),
            "synthesize_many": lambda: tts.synthesize_many([{"text": TEXT}]),
            "decoding_together": lambda: tts.decoding_together().__enter__(),
            "whole_keywords": lambda: tts.whole_keywords({})}


@pytest.mark.parametrize("family", FAMILIES)
def test_f5_a_closed_model_refuses_every_public_method_alike(files, family):
    tts = load(files, family)
    tts.close()
    name = type(tts).__name__
    table = calls(tts, family)
    public = [m for m, v in inspect.getmembers(type(tts), inspect.isroutine)
              if not m.startswith("_") and m not in ("close", "load", "prompt_ids")]
    assert set(public) <= set(table), f"no call written for {set(public) - set(table)}"
    for method in public:
        with pytest.raises(InputError, match=rf"^this {name} is closed; load it again"):
            table[method]()
    tts.close()      # closing twice is fine


def test_f5_a_closed_codec_refuses_every_public_method_alike(codec_gguf):
    codec = Codec.load(codec_gguf, threads=THREADS)
    x = np.zeros((64, 2), np.float32)
    codes = np.zeros((codec.n_quantizers, 2), np.int32)
    codec.close()
    table = {"encode": lambda: codec.encode(x, codec.sample_rate),
             "encode_blocks": lambda: codec.encode_blocks([x], codec.sample_rate),
             "decode": lambda: codec.decode(codes), "check_codes": lambda: codec.check_codes(codes),
             "reconstruct": lambda: codec.reconstruct(x, codec.sample_rate),
             "stream_decoder": lambda: codec.stream_decoder(),
             "stream_batch": lambda: codec.stream_batch(2)}
    public = [m for m, v in inspect.getmembers(Codec, inspect.isroutine)
              if not m.startswith("_") and m not in ("close", "load")]
    assert set(public) <= set(table), f"no call written for {set(public) - set(table)}"
    for method in public:
        with pytest.raises(InputError, match=r"^this codec is closed; load it again"):
            table[method]()


# --- finding 6: no audio is an error; one budget warning per call; budgets bounded --------------


def test_f6a_no_audio_is_an_error_saying_why(loaded, files, nano_tts, local_v15_files, v2_codec_gguf):
    with pytest.raises(InputError, match=r"no audio was made: the frame budget "
                                         r"\(max_new_rows=2\) ran out .* raise max_new_rows"):
        loaded("delay").synthesize(TEXT, max_new_rows=2)
    with pytest.raises(InputError, match="no audio was made: the model ended"):
        nano_tts(0, 50.0).synthesize(TEXT, max_text_tokens=5)    # no pauses for silent chunks
    quiet = [nano_tts(0, 50.0),              # its model stops at once
             LocalV15TTS.load(local_v15_files(-20.0)[3], codec=v2_codec_gguf, threads=THREADS)]
    try:
        for tts in quiet:
            with pytest.raises(InputError, match="no audio was made: the model ended the speech "
                                                 "before its first audio frame"):
                tts.synthesize(TEXT, seed=1)
            with pytest.raises(InputError, match="no audio was made"):
                list(tts.stream(TEXT, seed=1))
    finally:
        quiet[1].close()


def test_f6a_live_mode_with_no_text_is_an_error(loaded):
    tts = loaded("realtime")
    with pytest.raises(InputError, match=r"no text arrived \(stdin was empty\)"):
        list(live_chunks(tts.session(seed=1), iter(()), tts.channels))
    # guard: with text the same route speaks
    assert sum(len(c) for c in live_chunks(tts.session(seed=1), iter([TEXT]), 1)) > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_f6b_one_budget_warning_per_call_whatever_the_chunks(loaded, family):
    tts = loaded(family)
    kw = dict(max_text_tokens=5) if family == "nano" else {}      # many chunks, all cut
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        audio, _ = tts.synthesize(TEXT, seed=3, **small(family), **kw)
    cuts = [w for w in seen if issubclass(w.category, BudgetWarning)]
    assert len(audio) and len(cuts) == 1, [str(w.message) for w in seen]
    keyword = type(tts).BUDGET.keyword
    assert f"raise {keyword}" in str(cuts[0].message) and "audio is cut" in str(cuts[0].message)
    if family == "nano":
        assert str(cuts[0].message).startswith(f"{len(tts.plan(TEXT, max_text_tokens=5))} of ")
    # guard: the same call with room to finish does not warn (Realtime stops after its text)
    if family == "realtime":
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            tts.synthesize(TEXT, seed=3, max_frames=200)
        assert not [w for w in seen if issubclass(w.category, BudgetWarning)]


@pytest.mark.parametrize("family", FAMILIES)
def test_f6c_each_family_declares_its_budget_and_it_is_bounded_before_any_work(loaded, family):
    cls, tts = CLASSES[family], loaded(family)
    budget = cls.BUDGET
    signature = inspect.signature(cls.stream).parameters
    assert signature[budget.keyword].default == budget.default <= budget.limit
    assert budget.per_chunk == (family != "realtime")    # the families that cut long text
    for value in (budget.limit + 1, 10**9, 0, 2.5):
        with pytest.raises(InputError, match=rf"^{budget.keyword} must be a whole number in "
                                             rf"\[1, {budget.limit}\]"):
            tts.stream(TEXT, **{budget.keyword: value})   # refused at the call: nothing ran
    # the research route too, under the model's own name for the budget
    name = {"delay": "max_new_rows", "local": "max_new_frames"}.get(family, "max_frames")
    rows = np.zeros((3, tts.config.n_vq + 1), np.int64)
    with pytest.raises(InputError, match=rf"^{name} must be a whole number in \[1, "):
        tts.generate(rows, **{name: budget.limit + 1})
    if family == "realtime":
        with pytest.raises(InputError, match=r"^max_frames must be a whole number in"):
            tts.session(max_frames=budget.limit + 1)


# --- issue 33, part 3: seed and options are the base's checks on every family and route -------


BAD_CHOICES = pytest.mark.parametrize(
    "words", [dict(seed=-1), dict(seed="x"), dict(seed=1.5), dict(options={}), dict(options=3)],
    ids=["seed -1", "seed 'x'", "seed 1.5", "options {}", "options 3"])


@pytest.mark.parametrize("family", FAMILIES)
@BAD_CHOICES
def test_f7_a_bad_seed_or_options_is_the_same_input_error_on_every_family(loaded, family, words):
    """Delay, Local and Realtime handed a bad seed to numpy (its ValueError) and bad options
    to their samplers (an AttributeError): each route now gives Nano's one-line InputError
    (the options' class named as the family's own) before any work."""
    def refused(tts, route):
        rows = np.zeros((3, tts.config.n_vq + 1), np.int64)
        call = {"stream": lambda: tts.stream(TEXT, **words),
                "synthesize": lambda: tts.synthesize(TEXT, **words),
                "generate": lambda: tts.generate(rows, **words)}[route]
        with pytest.raises(InputError) as e:
            call()
        return str(e.value)

    tts, nano = loaded(family), loaded("nano")
    for route in ("stream", "synthesize", "generate"):
        got = refused(tts, route)
        want = refused(nano, route).replace("SamplingOptions", tts.OPTIONS.__name__)
        assert got == want and "\n" not in got, (route, got)


@pytest.mark.parametrize("family", FAMILIES)
@BAD_CHOICES
def test_f7_a_batch_job_refuses_a_bad_seed_or_options_as_generate_does(loaded, family, words):
    """A job made for a family's BatchFamily with a bad seed or options is refused when it is
    made, with `generate`'s InputError (Delay's and Local's failed at joining, in numpy or
    their samplers; Realtime's in numpy when made)."""
    tts = loaded(family)
    rows = np.zeros((3, tts.config.n_vq + 1), np.int64)
    budget = {"delay": "max_new_rows", "local": "max_new_frames"}.get(family, "max_frames")
    with pytest.raises(InputError) as alone:
        tts.generate(rows, **words)
    with pytest.raises(InputError) as batched:
        tts.BATCHED(tts.model).job(rows, **{"options": tts.OPTIONS(), "seed": None, budget: 4,
                                           **words})
    assert str(batched.value) == str(alone.value)
