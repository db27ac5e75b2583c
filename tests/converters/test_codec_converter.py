"""converters/codec.py: the tiny MOSS-Audio-Tokenizer v1 checkpoint (fixtures/make_codec.py) →
codec GGUF. Expected values are computed here from config.json and the raw safetensors, not
through the converter's own helpers (docs/upstream-notes.md §codecs-1.5, §codecs-1.6,
§codecs-2.3)."""

import json
import logging
import re
import shutil
import sys

import numpy as np
import pytest

from converters.checkpoint import open_checkpoint
from converters.codec import convert
from fixtures.compare import assert_close, assert_differs
from fixtures.make_codec import load_config, load_state, make_tiny_v1_checkpoint
from moss_tts.codec import Codec
from moss_tts.errors import ConfigError, ModelFileError
from moss_tts.ggml import GGMLType, GGUFFile, Weights
from tests.converters.helpers import edited_checkpoint, one_line

WN_G, WN_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
V1_NAMES = {".self_attn.in_projs.0.weight": ".self_attn.in_proj.weight",
            ".self_attn.out_projs.0.weight": ".self_attn.out_proj.weight",
            ".linear1.weight": ".ffn.0.weight", ".linear2.weight": ".ffn.2.weight"}
# Transformer and block-projection matmul weights: the only tensors outtype may change.
MATMUL = re.compile(r"^(encoder|decoder)\.\d+\.(input_proj|output_proj|transformer\.layers\.\d+\."
                    r"(self_attn\.(in|out)_proj|ffn\.[02]))\.weight$")
# The fused weight is computed in float64 and stored as f32: one rounding (values ≤ ~1.5).
FUSED_ATOL = 1e-6
# Decode of a quantized codec vs the f32 one, as RMS error over RMS signal: f16 weights keep
# ~11 bits (measured 5e-4), q8_0 ~8 bits per 32-block (measured 6.5e-3).
QUANT_REL_RMS = {"f16": 2e-3, "q8_0": 2e-2}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_v1_checkpoint(tmp_path_factory.mktemp("codec_ckpt") / "single", seed=0)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return make_tiny_v1_checkpoint(tmp_path_factory.mktemp("codec_ckpt") / "sharded", seed=0,
                                   sharded=True)


@pytest.fixture(scope="module")
def gguf(checkpoint, tmp_path_factory):
    return convert(str(checkpoint), tmp_path_factory.mktemp("codec_gguf") / "codec.gguf")


@pytest.fixture(scope="module")
def state(checkpoint):
    return load_state(checkpoint)


@pytest.fixture(scope="module")
def config(checkpoint):
    return load_config(checkpoint)


@pytest.fixture(scope="module")
def tensors(gguf):
    with Weights.load(gguf) as w:
        return {name: w.read(name) for name in w.names()}


def transformer_modules(config):
    """(tower, index, kwargs) of every transformer module of both towers."""
    return [(tower, i, kw) for tower in ("encoder", "decoder")
            for i, kw in enumerate(config[f"{tower}_kwargs"]) if kw["module_type"] == "Transformer"]


# -- layouts ----------------------------------------------------------------------------------


def test_single_file_and_sharded_checkpoints_give_identical_gguf_tensors(gguf, sharded,
                                                                         tmp_path, tensors):
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("*.safetensors"))) == 2
    other = convert(str(sharded), tmp_path / "sharded.gguf")
    with GGUFFile(gguf) as a, GGUFFile(other) as b:
        assert list(a.tensors) == list(b.tensors)
        types = {n: t.type for n, t in a.tensors.items()}
        assert types == {n: t.type for n, t in b.tensors.items()}
        assert a.keys() == b.keys()
        for key in a.keys():
            assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
    with Weights.load(other) as w:
        for name, want in tensors.items():
            assert_close(w.read(name), want, atol=0.0, what=name)


# -- tensor surgery ---------------------------------------------------------------------------


def test_weight_norm_pairs_are_fused_to_g_times_v_over_norm_v(state, tensors):
    bases = sorted(n[: -len(WN_G)] for n in state if n.endswith(WN_G))
    assert len(bases) == 2 + 2 * 8  # quantizer in/out + in/out per codebook
    for base in bases:
        g = state[base + WN_G].astype(np.float64)          # (out, 1, 1)
        v = state[base + WN_V].astype(np.float64)[:, :, 0]  # (out, in, 1) → (out, in)
        want = g[:, 0, :] * v / np.sqrt((v * v).sum(axis=1, keepdims=True))
        got = tensors[base + ".weight"]
        assert_close(got, want, atol=FUSED_ATOL, what=base)
        assert_differs(got, v, atol=FUSED_ATOL, what=f"{base} vs raw v")  # sensitivity guard
        assert_close(tensors[base + ".bias"], state[base + ".bias"], atol=0.0, what=base + ".bias")
    assert not any("parametrizations" in n for n in tensors)


def test_identity_projections_stay_absent_and_real_ones_are_kept(config, state, gguf, tensors):
    seen = set()
    with GGUFFile(gguf) as f:
        for tower, i, kw in transformer_modules(config):
            d = kw["d_model"]
            sides = (("input_proj", (kw["input_dimension"], d), "has_input_proj"),
                     ("output_proj", (d, kw["output_dimension"]), "has_output_proj"))
            for side, dims, flag in sides:
                name = f"{tower}.{i}.{side}.weight"
                present = dims[0] != dims[1]
                seen.add(present)
                assert (name in tensors) == present, name
                assert bool(f[f"moss.codec.{tower}.{flag}"][i]) == present, name
                if present:
                    assert_close(tensors[name], state[name], atol=0.0, what=name)
    assert seen == {True, False}  # the tiny config has both kinds


def test_v1_names_are_renamed_and_every_tensor_is_accounted_for(state, tensors):
    expected = {}
    for name in state:
        if name.endswith(WN_V) or name.endswith(WN_G):
            expected[name[: -len(WN_G)] + ".weight"] = None  # checked by the fusion test
            continue
        target = name
        for old, new in V1_NAMES.items():
            if name.endswith(old):
                target = name[: -len(old)] + new
        expected[target] = name
    assert set(tensors) == set(expected)
    renamed = [(t, s) for t, s in expected.items() if s is not None and t != s]
    assert len(renamed) == 4 * 8  # 8 layers in the tiny towers, 4 renamed matrices each
    for target, source in renamed:
        assert_close(tensors[target], state[source], atol=0.0, what=f"{source} → {target}")
    assert not [n for n in tensors if re.search(r"in_projs|out_projs|linear[12]", n)]


def test_stage_metadata_follows_the_config(config, gguf):
    """Each transformer's window is int(rate entering it × context duration); the rate starts at
    the sampling rate, is divided by each encoder patch and multiplied by each decoder patch."""
    duration = config["causal_transformer_context_duration"]
    rate = float(config["sampling_rate"])
    contexts = {}
    with GGUFFile(gguf) as f:
        for tower in ("encoder", "decoder"):
            meta = {k: [int(x) for x in f[f"moss.codec.{tower}.{k}"]]
                    for k in ("kind", "patch", "in_dim", "d_model", "out_dim", "n_heads",
                              "n_layers", "ffn", "context")}
            modules = config[f"{tower}_kwargs"]
            assert len(meta["kind"]) == len(modules)
            for i, kw in enumerate(modules):
                if kw["module_type"] == "PatchedPretransform":
                    assert (meta["kind"][i], meta["patch"][i]) == (0, kw["patch_size"])
                    h = kw["patch_size"]
                    rate = rate / h if tower == "encoder" else rate * h
                    continue
                context = int(rate * duration)
                contexts[f"{tower}.{i}"] = context
                assert meta["kind"][i] == 1
                got = {k: meta[k][i] for k in ("in_dim", "d_model", "out_dim", "n_heads",
                                               "n_layers", "ffn", "context")}
                assert got == {"in_dim": kw["input_dimension"], "d_model": kw["d_model"],
                               "out_dim": kw["output_dimension"], "n_heads": kw["num_heads"],
                               "n_layers": kw["num_layers"], "ffn": kw["dim_feedforward"],
                               "context": context}, f"{tower}.{i}"
        q = config["quantizer_kwargs"]
        assert f["moss.codec.variant"] == "v1" and f["moss.codec.channels"] == 1
        assert f["moss.codec.sample_rate"] == config["sampling_rate"]
        assert f["moss.codec.downsample_rate"] == config["downsample_rate"]
        assert f["moss.codec.code_dim"] == config["code_dim"]
        assert (f["moss.codec.quantizer.n_quantizers"], f["moss.codec.quantizer.codebook_size"],
                f["moss.codec.quantizer.codebook_dim"], f["moss.codec.quantizer.rvq_dim"]) == \
            (q["num_quantizers"], q["codebook_size"], q["codebook_dim"], q["rvq_dim"])
        assert json.loads(f["moss.codec.config_json"]) == config
    # 3200 Hz → 200 / 100 / 50 Hz at the encoder transformers, × 0.5 s; the decoder mirrors it
    assert contexts == {"encoder.1": 100, "encoder.3": 50, "encoder.5": 25,
                        "decoder.0": 25, "decoder.2": 50, "decoder.4": 100}


# -- strictness and broken checkpoints ----------------------------------------------------------

EXTRA = "encoder.1.transformer.layers.0.extra_gate.weight"


def add_extra(state):
    state[EXTRA] = np.full((4, 4), 0.5, np.float32)


def test_converter_strict_rejects_unmapped_key(checkpoint, tmp_path):
    src = edited_checkpoint(checkpoint, tmp_path / "extra", add_extra)
    with pytest.raises(ModelFileError) as e:
        convert(str(src), tmp_path / "out.gguf", strict=True)
    assert EXTRA in one_line(e)
    assert not (tmp_path / "out.gguf").exists()


def test_converter_without_strict_warns_and_skips_unmapped_key(checkpoint, tmp_path, caplog,
                                                               tensors):
    src = edited_checkpoint(checkpoint, tmp_path / "extra", add_extra)
    with caplog.at_level(logging.WARNING, logger="converters.codec"):
        out = convert(str(src), tmp_path / "out.gguf")
    assert any(EXTRA in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    with Weights.load(out) as w:
        assert set(w.names()) == set(tensors)
        for name in ("encoder.1.transformer.layers.0.ffn.0.weight", "quantizer.input_proj.weight"):
            assert_close(w.read(name), tensors[name], atol=0.0, what=name)


def _drop(name):
    return lambda state: state.pop(name)


def _reshape(name, shape):
    def edit(state):
        state[name] = np.resize(state[name], shape)
    return edit


BROKEN = {  # edit, substrings the one-line error must contain
    "missing_layer_weight": (_drop("decoder.2.transformer.layers.0.linear1.weight"),
                             ["decoder.2.transformer.layers.0.", "missing"]),
    "missing_codebook": (_drop("quantizer.quantizers.5.codebook.weight"),
                         ["quantizer.quantizers.5.codebook.weight"]),
    "missing_weight_norm_half": (_drop("quantizer.quantizers.2.out_proj" + WN_V),
                                 ["quantizer.quantizers.2.out_proj"]),
    # in_dim 16 != d_model 32 and d_model 32 != out_dim 16: upstream has a Linear here
    "missing_input_proj": (_drop("encoder.1.input_proj.weight"), ["encoder.1.input_proj.weight"]),
    "missing_output_proj": (_drop("decoder.4.output_proj.weight"),
                            ["decoder.4.output_proj.weight"]),
    "transposed_layer_weight": (_reshape("encoder.3.transformer.layers.0.linear2.weight", (64, 16)),
                                ["encoder.3.transformer.layers.0.", "shape"]),
    "wrong_codebook_shape": (_reshape("quantizer.quantizers.0.codebook.weight", (63, 4)),
                             ["quantizer.quantizers.0.codebook.weight", "(63, 4)"]),
}


@pytest.mark.parametrize("case", BROKEN)
def test_converter_reports_missing_or_misshapen_tensor_by_name(checkpoint, tmp_path, case):
    edit, expected = BROKEN[case]
    src = edited_checkpoint(checkpoint, tmp_path / case, edit)
    with pytest.raises(ModelFileError) as e:
        convert(str(src), tmp_path / "out.gguf")
    msg = one_line(e)
    for part in expected:
        assert part in msg, (part, msg)
    assert not (tmp_path / "out.gguf").exists()


def test_converter_rejects_projection_where_upstream_has_identity(checkpoint, tmp_path):
    """encoder.5 is 32 → 32 → 24: upstream v1 builds an Identity input projection, so a stray
    square `input_proj.weight` is an unexpected key there, not a weight to apply."""
    name = "encoder.5.input_proj.weight"
    src = edited_checkpoint(checkpoint, tmp_path / "stray",
                            lambda s: s.__setitem__(name, np.eye(32, dtype=np.float32) * 0.5))
    with pytest.raises(ModelFileError) as e:
        convert(str(src), tmp_path / "out.gguf", strict=True)
    assert name in one_line(e)


def test_v1_config_with_v2_spelled_attention_converts_as_the_same_v1_codec(checkpoint, tmp_path):
    """The family comes from config.json: upstream's v1 load hook also accepts `in_proj.weight`
    for `in_projs.0`, so a v1 config with that spelling is the same v1 codec."""
    def to_v2_names(state):
        for name in [n for n in state if ".in_projs.0." in n or ".out_projs.0." in n]:
            state[name.replace("in_projs.0", "in_proj").replace("out_projs.0", "out_proj")] = \
                state.pop(name)
    src = edited_checkpoint(checkpoint, tmp_path / "v2names", to_v2_names)
    renamed = convert(str(src), tmp_path / "renamed.gguf", strict=True)
    original = convert(str(checkpoint), tmp_path / "original.gguf", strict=True)
    with GGUFFile(renamed) as a, GGUFFile(original) as b:
        assert a["moss.codec.variant"] == b["moss.codec.variant"] == "v1"
        assert a.tensors.keys() == b.tensors.keys()
        assert [a[k].tolist() for k in ("moss.codec.encoder.context", "moss.codec.decoder.context")] \
            == [b[k].tolist() for k in ("moss.codec.encoder.context", "moss.codec.decoder.context")]


def _same_codec(a_path, b_path):
    """Two converted GGUFs hold the same codec: every metadata value but the stored
    config.json text, and every tensor, identical."""
    with GGUFFile(a_path) as a, GGUFFile(b_path) as b:
        keys = [k for k in a.keys() if k != "moss.codec.config_json"]
        assert keys == [k for k in b.keys() if k != "moss.codec.config_json"]
        for key in keys:
            assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
    with Weights.load(a_path) as wa, Weights.load(b_path) as wb:
        assert wa.names() == wb.names()
        for name in wa.names():
            assert_close(wa.read(name), wb.read(name), atol=0.0, what=name)


@pytest.mark.parametrize("resave", ["model_type", "model_type_and_module_durations"])
def test_v1_config_resaved_by_upstream_config_class_converts_as_the_same_v1_codec(
        checkpoint, gguf, tmp_path, resave):
    """Upstream's config class rewrites `model_type` to "moss-audio-tokenizer" on save (and the
    v2 class adds each module's `context_duration`, equal to the global one); with no channel
    keys that config was taken for a 2-channel codec. The towers decide: patches 16·2·2 = 64 =
    downsample_rate, one channel."""
    src = tmp_path / resave
    shutil.copytree(checkpoint, src)
    config = load_config(checkpoint)
    config["model_type"] = "moss-audio-tokenizer"
    if resave == "model_type_and_module_durations":
        for kw in config["encoder_kwargs"] + config["decoder_kwargs"]:
            if kw["module_type"] == "Transformer":
                kw["context_duration"] = config["causal_transformer_context_duration"]
    (src / "config.json").write_text(json.dumps(config))
    out = convert(str(src), tmp_path / "resaved.gguf", strict=True)
    with GGUFFile(out) as f:
        assert f["moss.codec.variant"] == "v1" and f["moss.codec.channels"] == 1
    _same_codec(out, gguf)


def test_v1_config_claiming_two_channels_converts_by_its_structure_with_a_warning(
        checkpoint, gguf, tmp_path, caplog):
    """The v2 config class writes its defaults number_channels 2 and channel interleave into a
    re-saved 24 kHz config; the towers still say mono, and the mismatch is not silent."""
    src = tmp_path / "claims_stereo"
    shutil.copytree(checkpoint, src)
    config = load_config(checkpoint) | {"number_channels": 2, "enable_channel_interleave": True}
    (src / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="converters.codec"):
        out = convert(str(src), tmp_path / "out.gguf", strict=True)
    assert "declares 2 channel(s), but its towers are a 1-channel codec" in caplog.text
    _same_codec(out, gguf)


def test_towers_that_fit_no_channel_count_are_a_one_line_config_error(checkpoint, tmp_path):
    src = tmp_path / "odd"
    shutil.copytree(checkpoint, src)
    (src / "config.json").write_text(json.dumps(load_config(checkpoint) | {"downsample_rate": 48}))
    with pytest.raises(ConfigError) as e:
        convert(str(src), tmp_path / "out.gguf")
    assert "patches multiply to 64" in one_line(e)


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="counts mappings in /proc/self/maps (Linux only)")
def test_a_failed_conversion_leaves_the_checkpoint_unmapped(checkpoint, tmp_path):
    """safetensors maps its files; a conversion that fails half-way (here: --strict on an extra
    tensor) closes them even while the caller still holds the exception."""
    src = edited_checkpoint(checkpoint, tmp_path / "extra",
                            lambda s: s.__setitem__("extra.weight", np.ones(2, np.float32)))
    weights = str((src / "model.safetensors").resolve())

    def mapped():
        with open("/proc/self/maps") as f:
            return sum(line.rstrip().endswith(weights) for line in f)

    with pytest.raises(ModelFileError) as excinfo:
        convert(str(src), tmp_path / "out.gguf", strict=True)
    assert excinfo.traceback and mapped() == 0
    with open_checkpoint(src):   # guard: an open checkpoint is seen in the count
        assert mapped() >= 1
    assert mapped() == 0


def test_converter_rejects_checkpoint_without_attention_weights(checkpoint, tmp_path):
    src = edited_checkpoint(checkpoint, tmp_path / "noattn", lambda state: [
        state.pop(n) for n in [n for n in state if ".self_attn." in n]])
    with pytest.raises(ConfigError) as e:
        convert(str(src), tmp_path / "out.gguf")
    assert "not a MOSS-Audio-Tokenizer checkpoint" in one_line(e)


def test_converter_reports_missing_config_json(checkpoint, tmp_path):
    src = tmp_path / "noconfig"
    src.mkdir()
    shutil.copy(checkpoint / "model.safetensors", src)
    with pytest.raises(ModelFileError) as e:
        convert(str(src), tmp_path / "out.gguf")
    assert "config.json" in one_line(e)


def test_converter_reports_directory_without_safetensors(checkpoint, tmp_path):
    src = tmp_path / "noweights"
    src.mkdir()
    shutil.copy(checkpoint / "config.json", src)
    with pytest.raises(ModelFileError) as e:
        convert(str(src), tmp_path / "out.gguf")
    assert "safetensors" in one_line(e)


def test_converter_reports_unknown_repo_id_when_offline(tmp_path, monkeypatch):
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    # the hub reads these at import time, so set the live values as well as the environment
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    with pytest.raises(ModelFileError) as e:
        convert("moss-tts-tests/no-such-codec", tmp_path / "out.gguf")
    assert "moss-tts-tests/no-such-codec" in one_line(e)


def test_converter_reports_a_path_that_does_not_exist(tmp_path):
    with pytest.raises(ModelFileError) as e:
        convert(str(tmp_path / "nowhere" / "ckpt"), tmp_path / "out.gguf")
    assert "nowhere" in one_line(e)


# -- output types -------------------------------------------------------------------------------


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_outtype_changes_only_transformer_and_projection_matmuls(checkpoint, tmp_path, outtype,
                                                                 tensors):
    path = convert(str(checkpoint), tmp_path / f"codec-{outtype}.gguf", outtype=outtype)
    want_type = GGMLType.parse(outtype)
    with GGUFFile(path) as f:
        types = {n: t.type for n, t in f.tensors.items()}
    assert set(types) == set(tensors)
    for name, t in types.items():
        if not MATMUL.match(name):
            assert t == GGMLType.F32, name  # quantizer, norms, layer scales, biases, codebooks
        elif tensors[name].shape[-1] % 32 and want_type == GGMLType.Q8_0:
            assert t == GGMLType.F16, name  # rows of 16 do not fill a q8_0 block of 32
        else:
            assert t == want_type, name
    assert sum(t == want_type for t in types.values()) >= 20  # non-vacuous
    assert not [n for n in types if n.startswith("quantizer.") and types[n] != GGMLType.F32]


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_quantized_codec_decodes_close_to_f32(checkpoint, gguf, tmp_path, outtype):
    path = convert(str(checkpoint), tmp_path / f"codec-{outtype}.gguf", outtype=outtype)
    codes = np.random.default_rng(8).integers(0, 64, (8, 40), dtype=np.int32)
    with Codec.load(gguf, threads=1) as ref_codec, Codec.load(path, threads=1) as codec:
        want, got = ref_codec.decode(codes), codec.decode(codes)
    rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
    assert np.isfinite(got).all() and 0 < rel < QUANT_REL_RMS[outtype], rel


def test_decoder_type_lightens_the_decoder_and_keeps_the_encoder_and_its_codes(
        checkpoint, gguf, tmp_path, tensors):
    """--decoder-type q8_0: the decoder's linears in q8_0, everything else as --outtype (f32),
    so encode gives the f32 codec's codes exactly and decode moves by q8_0's rounding."""
    path = convert(str(checkpoint), tmp_path / "codec-dec-q8_0.gguf", decoder_type="q8_0")
    with GGUFFile(path) as f:
        types = {n: t.type for n, t in f.tensors.items()}
    light = {n for n, t in types.items() if t != GGMLType.F32}
    assert light and all(n.startswith("decoder.") and MATMUL.match(n) for n in light), light
    assert {n for n in types if n.startswith("decoder.") and MATMUL.match(n)
            and tensors[n].shape[-1] % 32 == 0} <= {n for n in light if types[n] == GGMLType.Q8_0}
    audio = np.random.default_rng(3).standard_normal(64 * 40).astype(np.float32) * 0.1
    codes = np.random.default_rng(8).integers(0, 64, (8, 40), dtype=np.int32)
    with Codec.load(gguf, threads=1) as ref_codec, Codec.load(path, threads=1) as codec:
        np.testing.assert_array_equal(codec.encode(audio, codec.sample_rate),
                                      ref_codec.encode(audio, codec.sample_rate))
        want, got = ref_codec.decode(codes), codec.decode(codes)
    rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
    assert 0 < rel < QUANT_REL_RMS["q8_0"], rel


def test_decoder_type_is_a_convert_flag_of_the_codec_only(checkpoint, tmp_path):
    from converters.registry import convert_options

    assert convert_options("codec", {"decoder_type": "f16"}) == {"decoder_type": "f16"}
    with pytest.raises(ConfigError, match="--decoder-type applies to convert codec only"):
        convert_options("nano", {"decoder_type": "f16"})
    with pytest.raises(ConfigError, match="q9"):
        convert(str(checkpoint), tmp_path / "bad.gguf", decoder_type="q9")
    assert not (tmp_path / "bad.gguf").exists()


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("min_params, want", [(1, GGMLType.Q6_K), (10**12, GGMLType.F32)],
                         ids=["large", "small"])
def test_the_stream_decoder_type_is_chosen_by_the_decoders_size(tmp_path, monkeypatch, variant,
                                                                 min_params, want):
    """`--decoder-type stream` (what a repo id converts to): q6_K for a decoder of
    STREAM_MIN_PARAMS or more (the 24 kHz and v2 decoders, whose every streamed frame reads all
    their weights), --outtype below it (Nano's). The tiny decoders stand for both sides of the
    bound; their rows fit no q6_K block, so q6_K shows as converters.gguf_io's fallback (f16),
    never f32. The encoder is f32 throughout."""
    import converters.codec as codec_converter
    import fixtures.make_codec as make

    monkeypatch.setattr(codec_converter, "STREAM_MIN_PARAMS", min_params)
    ckpt = getattr(make, f"make_tiny_{variant}_checkpoint")(tmp_path / "ckpt", seed=0)
    path = convert(str(ckpt), tmp_path / "codec.gguf", decoder_type="stream")
    with GGUFFile(path) as f:
        types = {n: t.type for n, t in f.tensors.items()}
    decoder = {types[n] for n in types if n.startswith("decoder.") and MATMUL.match(n)}
    assert all(t == GGMLType.F32 for n, t in types.items() if not n.startswith("decoder."))
    assert decoder == ({GGMLType.F32} if want == GGMLType.F32 else {GGMLType.F16}), decoder


def test_the_real_decoders_sizes_fall_on_each_side_of_the_stream_bound():
    """At the real shapes (docs/upstream-notes.md §codecs-2.2, shared/reference): the 24 kHz
    decoder's 0.9 B linear parameters take q6_K, a decoder of Nano's size (4 stages of 2-4
    layers at width 512, ~30 M) keeps --outtype."""
    from converters.codec import STREAM_DECODER_TYPE, stream_decoder_type
    from converters.gguf_io import Lazy

    def decoder(stages):              # (width, ffn, layers) per stage → its linears, unloaded
        out = {}
        for i, (d, ffn, layers) in enumerate(stages):
            for l in range(layers):
                p = f"decoder.{2 * i}.transformer.layers.{l}."
                for name, shape in (("self_attn.in_proj.weight", (3 * d, d)),
                                    ("self_attn.out_proj.weight", (d, d)),
                                    ("ffn.0.weight", (ffn, d)), ("ffn.2.weight", (d, ffn))):
                    out[p + name] = Lazy(shape, np.float32, lambda: None)
        return out
    v1 = decoder([(1280, 5120, 32), (768, 3072, 12), (768, 3072, 12), (768, 3072, 12)])
    assert stream_decoder_type(v1) == STREAM_DECODER_TYPE == "q6_K"
    assert stream_decoder_type(decoder([(512, 2048, 4)] * 4)) is None
