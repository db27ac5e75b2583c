"""moss_tts/models/spec.py: a block declared once gives the weights record, the shapes and the
converter mapping; a config dataclass is read from GGUF metadata by field name or mapped key."""

from dataclasses import dataclass

import pytest

from converters.gguf_io import write_gguf
from moss_tts.errors import ModelFileError
from moss_tts.ggml import GGUFFile
from moss_tts.models import spec

SPECS = (spec.TensorSpec("attn_q.weight", (8, 4), source="self_attn.q_proj.weight"),
         spec.TensorSpec("attn_norm.weight", (4,), source="input_layernorm.weight"),
         spec.TensorSpec("bias", (8,), optional=True))


@dataclass(frozen=True)
class Layer:
    attn_q_weight: object
    attn_norm_weight: object
    bias: object


@dataclass(frozen=True)
class Cfg:
    hidden_size: int
    num_heads: int
    rope_theta: float = 10000.0


def test_block_spec_gives_shapes_mapping_and_record():
    assert spec.shapes(SPECS, "blk.0.") == {"blk.0.attn_q.weight": (8, 4),
                                            "blk.0.attn_norm.weight": (4,), "blk.0.bias": (8,)}
    assert spec.source_names(SPECS, "blk.0.", "model.layers.0.") == {
        "model.layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
        "model.layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
        "model.layers.0.bias": "blk.0.bias"}
    assert spec.optional_names(SPECS, "blk.0.") == ("blk.0.bias",)
    rec = spec.fill_record(Layer, {"blk.0.attn_q.weight": "q", "blk.0.attn_norm.weight": "n"},
                           "blk.0.", SPECS)
    assert rec == Layer("q", "n", None)
    with pytest.raises(KeyError):   # a required tensor is never silently None
        spec.fill_record(Layer, {"blk.0.attn_q.weight": "q"}, "blk.0.", SPECS)


def test_config_reads_fields_by_prefix_or_mapped_key(tmp_path):
    path = write_gguf(tmp_path / "c.gguf", {}, {"m.hidden_size": 64, "llm.head_count": 4},
                      kind="test", version=1)
    with GGUFFile(path) as f:
        cfg = spec.config_from_gguf(Cfg, f, "m", keys={"num_heads": "llm.head_count"})
        assert cfg == Cfg(64, 4)                       # rope_theta keeps its default
        with pytest.raises(ModelFileError, match="'m.num_heads' is missing"):
            spec.config_from_gguf(Cfg, f, "m")
    assert spec.config_to_metadata(Cfg(64, 4), "m") == {"m.hidden_size": 64, "m.num_heads": 4,
                                                       "m.rope_theta": 10000.0}
