"""The delay staircase and the §family-2.6 state machine (models/delay_state.py, delay.next_row)
simulated against the step-by-step reference in fixtures/reference/delay.py, driven by scripted
logits: forced DELAY / AUDIO_END, the text masks (P3), the extra frame (P2), the pooled
repetition history (P5), continuation from a prompt that ends inside audio."""

import numpy as np
import pytest

from fixtures.reference import delay as ref
from moss_tts.models import qwen3
from moss_tts.models.delay import DelayConfig, audio_seen, next_row
from moss_tts.models.delay_state import DelayState, audio_segments, de_delay
from moss_tts.text.delay_prompts import delay
from moss_tts.sampling import DelaySamplingOptions

N_VQ, PAD_CODE, VOCAB = 4, 16, 40
PAD, IM_START, IM_END, START, END, USER, GEN, DELAY = 0, 1, 2, 5, 6, 7, 8, 9
K = 5                                     # GEN rows the script asks for
CFG = DelayConfig(qwen3.Qwen3Config(16, 1, 2, 1, 8, 16, 1e6), vocab_size=VOCAB, n_vq=N_VQ,
                  audio_vocab_size=PAD_CODE, pad_token_id=PAD, im_start_token_id=IM_START,
                  im_end_token_id=IM_END, audio_user_slot_token_id=USER,
                  audio_assistant_gen_slot_token_id=GEN, audio_assistant_delay_slot_token_id=DELAY,
                  audio_start_token_id=START, audio_end_token_id=END, audio_pad_code=PAD_CODE)
REF_CFG = {"n_vq": N_VQ, "audio_pad_code": PAD_CODE, "pad_token_id": PAD, "im_end_token_id": IM_END,
           "audio_start_token_id": START, "audio_end_token_id": END,
           "audio_assistant_gen_slot_token_id": GEN, "audio_assistant_delay_slot_token_id": DELAY}
GREEDY = DelaySamplingOptions().greedy()


def scripted_logits(n_prompt):
    """Text logits that *prefer* DELAY and <|im_end|> where the masks forbid them, then GEN
    ×K, one DELAY, and <|im_end|>; audio logits seeded by the row count (peaked, never ties)."""
    def logits(rows):
        t = len(rows) - n_prompt
        rng = np.random.default_rng(1000 + len(rows))
        text = rng.standard_normal(VOCAB)
        bonus = ({DELAY: 10, IM_END: 9, START: 8} if t == 0 else
                 {GEN: 10, IM_END: 9} if t <= K else {DELAY: 10} if t == K + 1 else {IM_END: 10})
        for i, b in bonus.items():
            text[i] += b
        audio = rng.standard_normal((N_VQ, PAD_CODE + 1)) * 2
        audio[:, 3] += 1.5                # one favourite code, so the penalty has work to do
        return text, audio
    return logits


def run_runtime(prompt, logits_fn, max_new, opts=GREEDY):
    state = DelayState.from_prompt(prompt[:, 0], CFG.ids)
    seen = audio_seen(prompt[:, 1:], CFG)
    rows, new = prompt, []
    for _ in range(max_new):
        text, audio = logits_fn(rows)
        row, state = next_row(state, text, audio, seen, CFG, opts, None)
        seen |= audio_seen(row[None, 1:], CFG)
        new.append(row)
        rows = np.vstack([rows, row])
        if state.stopping:
            break
    return np.array(new)


def text_prompt():
    rows = np.full((6, N_VQ + 1), PAD_CODE)
    rows[:, 0] = [IM_START, 20, 21, IM_END, IM_START, 22]
    return rows


@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_state_machine_matches_reference_simulation(penalty):
    prompt = text_prompt()
    logits = scripted_logits(len(prompt))
    opts = DelaySamplingOptions(audio_repetition_penalty=penalty).greedy()
    got = run_runtime(prompt, logits, 60, opts)
    want = ref.generate_greedy(None, REF_CFG, prompt, 60, repetition_penalty=penalty,
                               logits_fn=logits)
    np.testing.assert_array_equal(got, want)
    # the trajectory of §family-2.6: AUDIO_START (DELAY and im_end were preferred but masked),
    # GEN×K, one sampled DELAY + N−1 forced, the forced AUDIO_END, then <|im_end|>
    assert got[:, 0].tolist() == [START] + [GEN] * K + [DELAY] * N_VQ + [END, IM_END]
    codes = de_delay(got[1:-2, 1:])
    assert codes.shape == (K + 1, N_VQ) and (codes != PAD_CODE).all()   # P2: one extra frame
    assert (got[0, 1:] == PAD_CODE).all() and (got[-2:, 1:] == PAD_CODE).all()


def test_repetition_penalty_is_pooled_over_codebooks_1_and_up():
    """P5: code 3 emitted once by codebook 1 is penalized for codebooks 1, 2, 3 (their history
    is pooled) but not for codebook 0 (its own history); a per-codebook history would let
    codebooks 2 and 3 pick it."""
    history = np.full((2, N_VQ), PAD_CODE)
    history[0, 1] = 3
    audio = np.zeros((N_VQ, PAD_CODE + 1))
    audio[:, 3], audio[:, 4] = 2.0, 1.5                   # 2.0 / 1.5 = 1.33 < 1.5
    state = DelayState(audio_len=N_VQ, is_audio=True, step=5)
    opts = DelaySamplingOptions(audio_repetition_penalty=1.5).greedy()
    row, _ = next_row(state, np.zeros(VOCAB), audio, audio_seen(history, CFG), CFG, opts, None)
    assert row[1:].tolist() == [3, 4, 4, 4]
    plain, _ = next_row(state, np.zeros(VOCAB), audio, audio_seen(history, CFG), CFG, GREEDY, None)
    assert plain[1:].tolist() == [3, 3, 3, 3]


def test_prompt_ending_in_audio_continues_that_item():
    """A prompt ending on GEN rows of an audio item (continuation, P28): generation starts in
    audio with audio_len counted from the last AUDIO_START."""
    prompt = text_prompt()
    tail = np.full((3, N_VQ + 1), PAD_CODE)
    tail[:, 0] = [START, GEN, GEN]
    tail[1, 1], tail[2, 1:3] = 4, [5, 6]
    prompt = np.vstack([prompt, tail])
    assert DelayState.from_prompt(prompt[:, 0], CFG.ids) == DelayState(audio_len=3, is_audio=True)
    logits = scripted_logits(len(prompt) - 1)        # the script's step 1: GEN rows
    got = run_runtime(prompt, logits, 60)
    want = ref.generate_greedy(None, REF_CFG, prompt, 60, logits_fn=logits)
    np.testing.assert_array_equal(got, want)
    assert got[0, 0] == GEN and (got[0, 1:4] != PAD_CODE).all()   # 3 codebooks on at once


def test_delay_and_de_delay_match_reference_and_the_worked_example(rng):
    codes = rng.integers(0, 16, size=(7, N_VQ))
    grid = delay(codes, PAD_CODE)
    np.testing.assert_array_equal(grid, ref.delay_pattern(codes, PAD_CODE))
    np.testing.assert_array_equal(de_delay(grid), codes)
    np.testing.assert_array_equal(de_delay(grid), ref.de_delay_pattern(grid))
    assert de_delay(grid[:N_VQ - 1]).shape == (0, N_VQ)
    # §family-2.5, N = 4, T = 3: row s+3 holds a2 b1 c0 and P; row s+4 holds P b2 c1 d0
    example = delay(np.array([[10, 20, 30, 40], [11, 21, 31, 41], [12, 22, 32, 42]]), -1)
    assert example[2].tolist() == [12, 21, 30, -1] and example[3].tolist() == [-1, 22, 31, 40]
    # guard: a staircase shifted one row the other way does not de-delay to the codes
    assert not np.array_equal(de_delay(np.roll(grid, 1, axis=0)), codes)


def test_audio_segments_split_at_all_pad_frames():
    codes = np.array([[1, 2], [PAD_CODE, PAD_CODE], [3, PAD_CODE], [4, 5], [PAD_CODE, PAD_CODE]])
    parts = audio_segments(codes, PAD_CODE)
    assert [p.tolist() for p in parts] == [[[1, 2]], [[3, PAD_CODE], [4, 5]]]
    assert audio_segments(np.full((2, 2), PAD_CODE), PAD_CODE) == []
