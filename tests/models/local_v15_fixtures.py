"""Tiny MOSS-TTS-Local-Transformer-v1.5 checkpoints (fixtures.make_local_v15) converted once per
session through the real converter with --strict and loaded through the real loader (style C30);
imported by the Local v1.5 test modules."""

import pytest

from moss_tts.ggml import F32, Weights, get_backend

THREADS = 1   # tiny ops: more threads only wait on each other on a shared machine


@pytest.fixture(scope="session")
def local_v15_files(tmp_path_factory):
    """continue_bias → (checkpoint dir, upstream-named float state (bf16 values), config.json
    dict, GGUF path); each made once."""
    from converters.local_v15 import convert
    from fixtures.make_local_v15 import make_state, make_tiny_local_v15_checkpoint, tiny_config

    made = {}

    def get(continue_bias=0.0):
        if continue_bias not in made:
            root = tmp_path_factory.mktemp(f"local_v15_bias{continue_bias:g}")
            ckpt = make_tiny_local_v15_checkpoint(root / "hf", continue_bias=continue_bias)
            gguf = convert(str(ckpt), root / "local-v15.gguf", strict=True)
            made[continue_bias] = (ckpt, make_state(tiny_config(), 0, continue_bias),
                                   tiny_config(), gguf)
        return made[continue_bias]

    return get


@pytest.fixture(scope="session")
def local_v15_model(local_v15_files):
    """continue_bias → LocalV15Model with an f32 KV cache (parity sees f32 rounding only)."""
    from moss_tts.models.local_v15 import LocalV15Model

    made = {}

    def get(continue_bias=0.0):
        if continue_bias not in made:
            made[continue_bias] = LocalV15Model(
                Weights.load(local_v15_files(continue_bias)[3], get_backend(None, THREADS)),
                kv_type=F32)
        return made[continue_bias]

    yield get
    for model in made.values():
        model.close()
