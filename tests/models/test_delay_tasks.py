"""MossTTSDelay's other published checkpoints on their tiny layouts (models/delay_tasks.py):
each task's prompt rows against rows built independently by the string route of upstream's
processor (fixtures/reference/delay.py `prompt_rows_by_string`, after upstream's HF
`UserMessage` template and `_get_unified_codes`), with the message each task's upstream code
builds; then audio end to end (streamed == synthesize == the offline route) and bad input."""

import numpy as np
import pytest

from fixtures.make_delay import AUDIO_VOCAB, PUBLISHED_N_VQ, make_tokenizer_json, tiny_config
from fixtures.reference import delay as ref
from moss_tts.audio import loudness_normalize, resample
from moss_tts.errors import InputError
from moss_tts.models.delay_state import audio_segments, de_delay
from moss_tts.models.delay_tasks import Speaker
from moss_tts.reference import Reference
from moss_tts.sampling import DelaySamplingOptions

CFG = tiny_config(n_vq=PUBLISHED_N_VQ)
GREEDY = DelaySamplingOptions().greedy()


def codes(frames, seed):
    return np.random.default_rng(seed).integers(0, AUDIO_VOCAB, size=(frames, PUBLISHED_N_VQ))


def want_rows(text, **kw):
    return ref.prompt_rows_by_string(make_tokenizer_json(), CFG, text, **kw)


# -- MOSS-TTSD: upstream clis/moss_ttsd_app.py run_inference + build_conversation ------------
def test_dialogue_without_references_is_upstream_generation_mode(published_tts):
    tts = published_tts("ttsd")
    rows = tts.plan("[S1]Hello there.[S2]Fine, thanks.", normalize=False)
    np.testing.assert_array_equal(rows, want_rows("[S1]Hello there.[S2]Fine, thanks."))


def test_dialogue_with_references_is_upstream_continuation_mode(published_tts):
    """Speakers 1 and 3 cloned, 2 not: each reference's codes in the user message under its
    own number (the None one counted, not written), the transcripts tagged and leading the
    dialogue (merged turns), and the two speakers' codes concatenated as the assistant audio."""
    tts = published_tts("ttsd")
    a, c = codes(5, 1), codes(3, 2)
    rows = tts.plan("[S1] Hello there. [S2] Fine. [S3] Good.", normalize=False,
                    speakers={1: (a, "Hi."), 2: None, 3: Speaker(c, "[S3] Yo.")})
    text = "[S1]Hi.[S3]Yo.[S1]Hello there.[S2]Fine.[S3]Good."      # _build_prefixed_text
    np.testing.assert_array_equal(rows, want_rows(text, references=[a, None, c],
                                                  prompt_codes=np.concatenate([a, c])))


def test_a_speakers_speech_is_encoded_alone_and_all_of_it_at_once_for_the_prompt(published_tts):
    """Waveforms: each reference encoded on its own for the user message, the prompt audio one
    encoding of the speakers' speech concatenated (upstream's concat_prompt_wav)."""
    tts = published_tts("ttsd")
    rng = np.random.default_rng(3)
    s1 = (0.1 * rng.standard_normal(6400)).astype(np.float32)
    s2 = (0.1 * rng.standard_normal(4800)).astype(np.float32)
    rows = tts.plan("[S2] Fine.", normalize=False,
                    speakers=[((s1, 3200), "One."), ((s2, 6400), "Two.")])
    codec = tts.codec
    one = [codec.encode(loudness_normalize(x[:, None]), 3200, n_quantizers=PUBLISHED_N_VQ).T
           for x in (s1, resample(s2[:, None], 6400, 3200)[:, 0])]
    both = np.concatenate([s1, resample(s2[:, None], 6400, 3200)[:, 0]])[:, None]
    prompt = codec.encode(loudness_normalize(both), 3200, n_quantizers=PUBLISHED_N_VQ).T
    np.testing.assert_array_equal(rows, want_rows("[S1]One.[S2]Two.Fine.", references=one,
                                                  prompt_codes=prompt))


def test_a_stored_voice_brings_its_transcript(published_tts):
    tts = published_tts("ttsd")
    a = codes(4, 5)
    rows = tts.plan("[S1] More.", normalize=False,
                    speakers=[Reference(a, name="alice", transcript="Some words.")])
    np.testing.assert_array_equal(rows, want_rows("[S1]Some words.More.", references=[a],
                                                  prompt_codes=a))


@pytest.mark.parametrize("speakers, text, match", [
    ([(codes(3, 1), None)], "[S1] Hi.", r"^speakers: speaker 1 has reference speech but no "
                                       r"transcript"),
    ({2: (None, "Hi.")}, "[S1] Hi.", r"^speakers: speaker 2 has a transcript but no reference"),
    ([(codes(3, 1), "  ")], "[S1] Hi.", r"^speakers: speaker 1's transcript is empty"),
    ({6: (codes(3, 1), "Hi.")}, "[S1] Hi.", r"^speakers: speaker numbers are 1 to 5"),
    ("alice", "[S1] Hi.", r"^speakers must be a list"),
    (None, "No tags at all.", r"tag"),
])
def test_bad_dialogue_input_is_one_line_naming_it(published_tts, speakers, text, match):
    with pytest.raises(InputError, match=match) as e:
        published_tts("ttsd").synthesize(text, speakers=speakers, max_new_rows=4)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("given", [
    lambda a: {1: (a, "Hi.")}, lambda a: [(a, "Hi.")], lambda a: [(a, "Hi."), None]],
    ids=["dict", "one_item_list", "list_with_none"])
def test_a_speaker_given_no_voice_is_the_models_choice_in_every_form(published_tts, given):
    """Upstream's TTSD app clones S1 and leaves S2 to the model (references [S1, None]): every
    spelling of "S1 only" gives that prompt, with [S2] in the dialogue; S2 alone likewise."""
    tts = published_tts("ttsd")
    a = codes(4, 3)
    dialogue = "[S1] Hello there. [S2] Fine."
    rows = tts.plan(dialogue, normalize=False, speakers=given(a))
    np.testing.assert_array_equal(rows, want_rows("[S1]Hi.Hello there.[S2]Fine.",   # merged
                                                  references=[a, None], prompt_codes=a))
    rows = tts.plan(dialogue, normalize=False, speakers={2: (a, "Yo.")})
    np.testing.assert_array_equal(rows, want_rows("[S2]Yo.[S1]Hello there.[S2]Fine.",
                                                  references=[None, a], prompt_codes=a))


# -- MOSS-VoiceGenerator: upstream's moss_voice_generator_model_card.md (build_user_message
# with text and instruction, mode "generation") -----------------------------------------------
def test_voice_design_prompt_carries_the_instruction(published_tts):
    rows = published_tts("voicegen").plan("Hello there.", instruction="A warm, low voice.",
                                          normalize=False)
    np.testing.assert_array_equal(rows, want_rows("Hello there.",
                                                  instruction="A warm, low voice."))


@pytest.mark.parametrize("instruction", [None, "", "   "])
def test_voice_design_requires_an_instruction(published_tts, instruction):
    with pytest.raises(InputError, match=r"^instruction is required") as e:
        published_tts("voicegen").synthesize("Hello.", instruction=instruction)
    assert "\n" not in str(e.value)


def test_an_instruction_normalized_to_nothing_is_one_line(published_tts):
    """Its processor drops [...] spans (normalize_inputs): an instruction of nothing else would
    describe no voice; as written (normalize=False) it is the prompt's."""
    tts = published_tts("voicegen")
    with pytest.raises(InputError, match=r"^instruction: nothing is left of it") as e:
        tts.plan("Hello.", instruction="[calm] {low}")
    assert "\n" not in str(e.value)
    rows = tts.plan("Hello.", instruction="[calm] {low}", normalize=False)
    np.testing.assert_array_equal(rows, want_rows("Hello.", instruction="[calm] {low}"))


def test_voice_design_takes_no_reference(published_tts):
    with pytest.raises(InputError, match="reference"):
        published_tts("voicegen").synthesize("Hello.", instruction="Calm.",
                                             reference=codes(3, 1))


# -- MOSS-SoundEffect: upstream's moss_sound_effect_model_card.md (build_user_message with
# ambient_sound and tokens, no text) -----------------------------------------------------------
def test_sound_effect_prompt_is_the_description_and_duration_without_text(published_tts):
    tts = published_tts("sfx")
    rows = tts.plan(sound="Rain on a tin roof.", tokens=25)
    np.testing.assert_array_equal(rows, want_rows(None, ambient_sound="Rain on a tin roof.",
                                                  tokens=25))
    # the description as the text (the server's `input`) is the same prompt; seconds at the
    # codec's frame rate are tokens
    np.testing.assert_array_equal(tts.plan("Rain on a tin roof.", tokens=25), rows)
    seconds = 25 / tts.codec.config.frame_rate
    np.testing.assert_array_equal(tts.plan(sound="Rain on a tin roof.", seconds=seconds), rows)


@pytest.mark.parametrize("text, kw, match", [
    (None, {}, r"^sound: describe the sound"),
    ("Rain.", {"sound": "Rain."}, r"not both"),
    (None, {"sound": "  "}, r"^sound is empty"),
    (None, {"sound": "Rain.", "seconds": 0}, r"^seconds must be above 0"),
])
def test_bad_sound_effect_input_is_one_line_naming_it(published_tts, text, kw, match):
    with pytest.raises(InputError, match=match) as e:
        published_tts("sfx").synthesize(text, max_new_rows=4, **kw)
    assert "\n" not in str(e.value)


# -- end to end --------------------------------------------------------------------------------
def offline(tts, rows, **kw):
    """The offline route of §family-2.8 from the rows `generate` makes of the same prompt."""
    new = tts.model.generate(rows, **kw)
    segments = audio_segments(de_delay(new[:, 1:]), tts.config.audio_pad_code)
    return np.concatenate([tts.codec.decode(s.T, n_quantizers=PUBLISHED_N_VQ)
                           for s in segments])


@pytest.mark.parametrize("kind, args, kw", [
    ("ttsd", ("[S1] Hello there. [S2] Fine.",), {}),
    ("voicegen", ("Hello there.",), {"instruction": "A calm voice."}),
    ("sfx", (), {"sound": "Rain on a roof.", "tokens": 12}),
], ids=["ttsd", "voicegen", "sfx"])
def test_each_task_streams_what_synthesize_and_the_offline_route_give(published_tts, kind,
                                                                     args, kw):
    tts = published_tts(kind)
    chunks = list(tts.stream(*args, options=GREEDY, max_new_rows=20, **kw))
    audio, sr = tts.synthesize(*args, options=GREEDY, max_new_rows=20, **kw)
    assert sr == tts.sample_rate and len(chunks) > 1
    np.testing.assert_array_equal(np.concatenate(chunks), audio)
    plan_kw = {k: v for k, v in kw.items()}
    want = offline(tts, tts.plan(*args, **plan_kw), options=GREEDY, max_new_rows=20)
    np.testing.assert_allclose(audio, want, atol=1e-5)


def test_a_cloned_dialogue_drops_the_speakers_prompt_audio(published_tts):
    """The output starts after the speakers' own speech: the continuation's prompt frames go
    through the codec first and their audio is not returned (as DelayTTS's continuation, and
    as upstream decodes only the new audio): the offline decode of prompt + generated frames
    with the prompt's frames of samples cut."""
    tts = published_tts("ttsd")
    a = codes(6, 7)
    kw = dict(options=GREEDY, max_new_rows=30)
    audio, _ = tts.synthesize("[S1] Hello there.", speakers=[(a, "Hi.")], **kw)
    rows = tts.plan("[S1] Hello there.", speakers=[(a, "Hi.")])
    generated = tts.model.generate(rows, **kw)
    staircase = np.vstack([rows[-len(a):, 1:], generated[:, 1:]])
    frames = de_delay(staircase)
    np.testing.assert_array_equal(frames[:len(a) - PUBLISHED_N_VQ + 1],
                                  a[:len(a) - PUBLISHED_N_VQ + 1])
    segments = audio_segments(frames, tts.config.audio_pad_code)
    full = np.concatenate([tts.codec.decode(s.T, n_quantizers=PUBLISHED_N_VQ)
                           for s in segments])
    hop = len(full) // sum(len(s) for s in segments)
    np.testing.assert_allclose(audio, full[len(a) * hop:], atol=1e-5)
    assert len(full) > len(audio) > 0


def test_a_long_dialogue_is_cut_at_turns_and_each_chunk_continues_the_one_before(
        published_tts, monkeypatch):
    """Long dialogues go through the long-text path (models/long_text.speak): chunks cut at
    speaker turns, chunk i + 1's continuation prompt is chunk i's text and generated frames,
    and the speakers' references stay in every chunk's user message."""
    from moss_tts.models.delay_tasks import DialogueTTS

    tts = published_tts("ttsd")
    seen = []
    real = DialogueTTS._rows

    def spy(self, text, cast, prompt, prompt_text, **kw):
        seen.append((text, cast, prompt, prompt_text))
        return real(self, text, cast, prompt, prompt_text, **kw)

    monkeypatch.setattr(DialogueTTS, "_rows", spy)
    turns = " ".join(f"[S{1 + i % 2}] Turn number {i} of a long talk about quick brown foxes."
                     for i in range(40))
    a = codes(4, 3)
    with pytest.warns(Warning):
        tts.synthesize(turns, speakers=[(a, "Hi."), None], options=GREEDY, max_new_rows=8)
    assert len(seen) >= 2
    for i, (text, cast, prompt, prompt_text) in enumerate(seen):
        assert text.startswith("[S") and cast.references[0] is not None
        if i == 0:
            assert prompt is None                       # the speakers' speech: cast.prompt
        else:
            assert prompt_text == seen[i - 1][0] and len(prompt.codes) > 0


# -- the family contract (moss_tts/models/tts.py, as tests/models/test_contract.py for the others) ----
@pytest.mark.parametrize("kind, args, kw, field", [
    ("ttsd", ("[S1] Hi\0.",), {}, "text"),
    ("ttsd", ("[S1] Hi.",), {"speakers": [(codes(3, 1), "Hi\0")]}, "transcript"),
    ("voicegen", ("Hi.",), {"instruction": "Calm\0"}, "instruction"),
    ("sfx", (), {"sound": "Rain\0"}, "sound"),
])
def test_text_that_is_not_clean_unicode_is_one_error_naming_its_field(published_tts, kind,
                                                                     args, kw, field):
    with pytest.raises(InputError, match=field) as e:
        published_tts(kind).synthesize(*args, max_new_rows=4, **kw)
    assert "NUL" in str(e.value) and "\n" not in str(e.value)


def test_a_stored_voice_of_another_codec_is_refused_by_name_as_a_speaker(published_tts):
    other = {"variant": "v2", "sample_rate": 48000, "codebook_size": 1024}
    voice = Reference(codes(3, 1), other, "narrator", "Hello.")
    with pytest.raises(InputError, match=r"voice 'narrator' does not fit this model"):
        published_tts("ttsd").synthesize("[S1] Hi.", speakers=[voice], max_new_rows=4)


@pytest.mark.parametrize("kind", ["ttsd", "voicegen", "sfx"])
def test_every_task_says_it_is_closed_after_close(published_files, v1_codec_gguf, kind):
    from moss_tts.models.registry import family_of_model

    tts = family_of_model(published_files(kind)[2]).tts_class().load(
        published_files(kind)[2], codec=v1_codec_gguf)
    tts.close()
    name = type(tts).__name__
    with pytest.raises(InputError, match=f"this {name} is closed"):
        tts.synthesize("[S1] Hi.")
