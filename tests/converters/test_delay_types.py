"""converters/delay.py types per group (`--outtype`, `--head-type`, `--embed-type`) through the
type hook of converters/gguf_io.py, on a tiny checkpoint wide enough for K-quants (rows of 256):
the types read back with the `gguf` package, and the q4_K model with q8_0 heads runs within the
stated tolerance of the float64 reference on its own (gguf-dequantized) weights and of f32."""

import subprocess
import sys

import gguf
import numpy as np
import pytest

from converters.delay import convert, delay_config, source_names
from fixtures.compare import assert_close, assert_differs
from fixtures.make_delay import make_state, make_tiny_delay_checkpoint, tiny_config
from fixtures.reference import delay as ref
from moss_tts.errors import ConfigError
from moss_tts.ggml import Weights
from moss_tts.ggml.types import GGMLType
from moss_tts.models.delay import AUDIO_HEADS, TEXT_HEAD, DelayModel, matmul_only
from moss_tts.sampling import DelaySamplingOptions

Q4_K, Q8_0, F16, F32 = GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.F16, GGMLType.F32
VOCAB = 512
# every row 256 wide (K-quant blocks), a vocabulary of 512 with the special ids moved into it
WIDE = tiny_config(**{k: 500 + i for i, k in enumerate((
    "pad_token_id", "im_start_token_id", "im_end_token_id", "audio_user_slot_token_id",
    "audio_assistant_gen_slot_token_id", "audio_assistant_delay_slot_token_id",
    "audio_start_token_id", "audio_end_token_id"))})
WIDE["language_config"] |= dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=64, intermediate_size=512, vocab_size=VOCAB)
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# The quantized model against the float64 reference of its own dequantized weights: what is
# left is ggml rounding the activations to 8 bits per block (q8_K for q4_K rows, q8_0 for the
# heads) and the f16 KV cache; measured ≤ 0.06 (hidden, |h| ≲ 4.4), ≤ 0.09 (logits, ≲ 5.3)
DEQUANT_ATOL = 0.2
# ... and against the f32 conversion: q4_K weights cost ~12 % relative RMS through 2 random
# blocks (measured 0.118 for hidden and text logits)
Q4_K_REL_RMS = 0.2


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    d = tmp_path_factory.mktemp("wide")
    state = make_state(WIDE, seed=5)
    # the tokenizer is only embedded by the converter: a stub keeps the fixture fast
    ckpt = make_tiny_delay_checkpoint(d / "hf", config=WIDE, state=state, tokenizer_json="{}")
    return ckpt, state


def gguf_types(path) -> dict[str, GGMLType]:
    """Each tensor's type as the `gguf` package reads it (not our reader)."""
    return {t.name: GGMLType(int(t.tensor_type)) for t in gguf.GGUFReader(path).tensors}


def dequantized_state(path) -> dict[str, np.ndarray]:
    """The GGUF's tensors dequantized by the `gguf` package, under upstream checkpoint names."""
    names = {g: s for s, g in source_names(delay_config(WIDE)).items()}
    state = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
        if t.name == AUDIO_HEADS:
            state |= {f"lm_heads.{k + 1}.weight": h for k, h in
                      enumerate(a.reshape(WIDE["n_vq"], -1, shape[1]))}
        else:
            state[names[t.name]] = a
    return state


def rows(seed=7, n=12):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.integers(0, 500, n),
                            rng.integers(0, WIDE["audio_vocab_size"] + 1, (n, WIDE["n_vq"]))])


def forward(path, r):
    model = DelayModel(Weights.load(path))
    try:
        return model.forward(r)[:2]
    finally:
        model.close()


def rel_rms(got, want) -> float:
    return float(np.sqrt(((got - want) ** 2).mean() / (want ** 2).mean()))


def test_q4_K_backbone_keeps_q8_0_heads_and_f32_tables_by_default(wide, tmp_path):
    types = gguf_types(convert(str(wide[0]), tmp_path / "q4.gguf", outtype="q4_K", strict=True))
    for i in range(2):
        assert {types[f"blk.{i}.{n}.weight"] for n in LINEARS} == {Q4_K}, i
        assert types[f"blk.{i}.attn_norm.weight"] == types[f"blk.{i}.attn_q_norm.weight"] == F32
    assert types[TEXT_HEAD] == types[AUDIO_HEADS] == Q8_0          # P21
    assert types["token_embd.weight"] == types["emb_ext.0.weight"] == F32
    assert types["output_norm.weight"] == F32


@pytest.mark.parametrize("outtype,head,embed,want", [
    ("q4_K", "f16", "q8_0", (Q4_K, F16, Q8_0)),
    ("q4_K", "q4_K", "f16", (Q4_K, Q4_K, F16)),    # a lower head only when asked for
    ("f16", None, "f32", (F16, F16, F32)),          # heads follow a type at or above q8_0
    ("q6_K", None, "bf16", (GGMLType.Q6_K, Q8_0, GGMLType.BF16)),
])
def test_each_group_takes_its_own_type(wide, tmp_path, outtype, head, embed, want):
    path = convert(str(wide[0]), tmp_path / "m.gguf", outtype=outtype, head_type=head,
                   embed_type=embed)
    types = gguf_types(path)
    got = (types["blk.1.ffn_down.weight"], types[TEXT_HEAD], types["token_embd.weight"])
    assert got == want
    assert types[AUDIO_HEADS] == want[1] and types["emb_ext.3.weight"] == want[2]


def test_q4_K_model_runs_close_to_its_weights_and_to_f32(wide, tmp_path):
    ckpt, state = wide
    q4 = convert(str(ckpt), tmp_path / "q4.gguf", outtype="q4_K", strict=True)
    f32 = convert(str(ckpt), tmp_path / "f32.gguf", strict=True)
    r = rows()
    hidden, text = forward(q4, r)
    deq = dequantized_state(q4)
    want_h = ref.hidden(deq, WIDE, r)
    want_text, _ = ref.heads(deq, WIDE, want_h)
    assert_close(hidden, want_h, atol=DEQUANT_ATOL, what="q4_K hidden vs its weights")
    assert_close(text, want_text, atol=DEQUANT_ATOL, what="q8_0 text head vs its weights")
    hidden32, text32 = forward(f32, r)
    assert 0 < rel_rms(hidden, hidden32) < Q4_K_REL_RMS
    assert 0 < rel_rms(text, text32) < Q4_K_REL_RMS
    # guard: the reference of the unquantized weights is off by more than DEQUANT_ATOL, so the
    # comparison above sees which weights the model ran on
    assert_differs(hidden, ref.hidden(state, WIDE, r), atol=DEQUANT_ATOL, what="f32 weights")


def test_rows_not_fitting_k_quant_blocks_fall_back_to_f16(tmp_path):
    """The 32-wide tiny model: q4_K rows must be multiples of 256, q8_0 rows of 32."""
    ckpt = make_tiny_delay_checkpoint(tmp_path / "hf", seed=1, tokenizer_json="{}")
    types = gguf_types(convert(str(ckpt), tmp_path / "m.gguf", outtype="q4_K", embed_type="q4_K"))
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == F16
    assert types[TEXT_HEAD] == Q8_0


@pytest.mark.parametrize("flag", ["outtype", "head_type", "embed_type"])
def test_a_type_ggml_cannot_write_is_refused_before_writing(wide, tmp_path, flag):
    with pytest.raises(ConfigError, match="q8_1: not a weight type ggml can write; pick one of"):
        convert(str(wide[0]), tmp_path / "x.gguf", **{flag: "q8_1"})
    assert not (tmp_path / "x.gguf").exists()


def cli(*args):
    return subprocess.run([sys.executable, "-m", "moss_tts", *map(str, args)],
                          capture_output=True, text=True)


def test_cli_flags_reach_the_delay_converter_and_no_other(wide, tmp_path):
    ckpt = wide[0]
    out = tmp_path / "c.gguf"
    r = cli("convert", "delay", "--model", ckpt, "--out", out, "--outtype", "q4_K",
            "--head-type", "f16", "--embed-type", "q8_0", "--quiet")
    assert r.returncode == 0, r.stderr
    types = gguf_types(out)
    assert (types["blk.0.attn_q.weight"], types[TEXT_HEAD], types["token_embd.weight"]) == \
        (Q4_K, F16, Q8_0)
    r = cli("convert", "codec", "--model", ckpt, "--out", tmp_path / "n.gguf", "--head-type", "f16")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert ("--head-type applies to convert delay / ttsd / voicegen / sfx / local / realtime "
            "only, not codec") in r.stderr
    assert not (tmp_path / "n.gguf").exists()


def load_with(path, repack: bool) -> DelayModel:
    return DelayModel(Weights.load(path, repack=matmul_only(repack)))


@pytest.mark.parametrize("outtype,env", [("q4_0", None), ("q4_K", "all")])
def test_model_with_repacked_blocks_matches_the_plain_load(wide, tmp_path, monkeypatch,
                                                           outtype, env):
    """ggml's CPU_REPACK layout for the q4_0 / q4_K block matrices (every Linear of both blocks;
    the q8_0 heads and the f32 tables stay plain). The repacked kernels round the activations to
    8 bits with their own 4-row quantizer, so a value can land one step apart: measured up to
    1.6 % (q4_K) / 1.0 % (q4_0) of the range between the two loads (seeds 2 and 3), while both
    stay as close to the float64 reference on the dequantized weights (≤ 0.09, DEQUANT_ATOL 0.2).
    Greedy generation gives the same rows. q4_0 repacks by default, q4_K only with
    MOSS_TTS_REPACK=all."""
    if env is None:
        monkeypatch.delenv("MOSS_TTS_REPACK", raising=False)
    else:
        monkeypatch.setenv("MOSS_TTS_REPACK", env)
    q4 = convert(str(wide[0]), tmp_path / "q4.gguf", outtype=outtype, strict=True)
    plain, packed = load_with(q4, False), load_with(q4, None)
    try:
        if not packed.weights.packed:
            pytest.skip(f"this ggml does not repack {outtype} on this CPU")
        assert packed.weights.packed == {f"blk.{i}.{n}.weight" for i in range(2) for n in LINEARS}
        assert plain.weights.packed == set()
        deq = dequantized_state(q4)
        for seed in (2, 7):
            r = rows(seed)
            hidden, text, audio = packed.forward(r)
            want_h = ref.hidden(deq, WIDE, r)
            assert_close(hidden, want_h, atol=DEQUANT_ATOL, what="repacked hidden vs weights")
            assert_close(text, ref.heads(deq, WIDE, want_h)[0], atol=DEQUANT_ATOL)
            for got, want in zip((hidden, text, audio), plain.forward(r)):
                finite = np.isfinite(want)
                assert_close(got[finite], want[finite], atol=0.03 * np.abs(want[finite]).max(),
                             what="repacked vs plain")
        greedy = DelaySamplingOptions().greedy()
        prompt = rows(seed=3, n=20)
        got = packed.generate(prompt, options=greedy, max_new_rows=12)
        assert len(got) == 12 and np.array_equal(got, plain.generate(prompt, options=greedy,
                                                                     max_new_rows=12))
    finally:
        plain.close()
        packed.close()


def test_repack_set_is_the_matmul_only_tensors_and_follows_the_switch(monkeypatch):
    monkeypatch.delenv("MOSS_TTS_REPACK", raising=False)
    pick = matmul_only(True)
    assert pick("blk.0.attn_q.weight", GGMLType.Q4_0) and pick(AUDIO_HEADS, GGMLType.Q4_0)
    assert not pick("blk.0.attn_q.weight", Q4_K)                   # measured slower repacked
    assert not pick("token_embd.weight", GGMLType.Q4_0)            # gathered by get_rows
    assert not pick(TEXT_HEAD, GGMLType.Q4_0)
    assert matmul_only(False) is None
    monkeypatch.setenv("MOSS_TTS_REPACK", "all")
    assert matmul_only(None)("blk.0.attn_q.weight", Q4_K)
    monkeypatch.setenv("MOSS_TTS_REPACK", "0")
    assert matmul_only(None) is None and matmul_only(True) is not None
