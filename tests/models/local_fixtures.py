"""Session fixtures of the MossTTSLocal tests (imported by tests/models/test_local*.py): the
tiny upstream-named checkpoint (fixtures.make_local) through the real converter with --strict,
its float state, and the model loaded by the real loader with an f32 backbone cache."""

import pytest

from fixtures.make_local import make_state, make_tiny_local_checkpoint, tiny_config
from moss_tts.ggml import F32, Weights, get_backend
from moss_tts.models.local import LocalModel

THREADS = 1   # tiny ops: one thread is fastest on a shared machine (tests/models/conftest.py)


@pytest.fixture(scope="session")
def local_files(tmp_path_factory):
    """(seed, speech) → (checkpoint dir, float state, config.json dict, GGUF path)."""
    from converters.local import convert

    made = {}

    def get(seed=0, speech=False):
        key = (seed, speech)
        if key not in made:
            root = tmp_path_factory.mktemp(f"local_seed{seed}_{'speech' if speech else 'plain'}")
            ckpt = make_tiny_local_checkpoint(root / "hf", seed=seed, speech=speech)
            gguf = convert(str(ckpt), root / "local.gguf", strict=True)
            made[key] = (ckpt, make_state(tiny_config(), seed, speech), tiny_config(), gguf)
        return made[key]

    return get


@pytest.fixture(scope="session")
def local_model(local_files):
    """(seed, speech) → LocalModel with an f32 backbone cache, loaded once."""
    made = {}

    def get(seed=0, speech=False):
        if (seed, speech) not in made:
            made[seed, speech] = LocalModel(Weights.load(local_files(seed, speech)[3],
                                                         get_backend(None, THREADS)), kv_type=F32)
        return made[seed, speech]

    yield get
    for model in made.values():
        model.close()
