import numpy as np
import pytest


@pytest.fixture
def rng():
    """Seeded randomness: never all zeros or ones (style C28a)."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def rpc_server():
    """A ggml RPC server serving the CPU in a child process (moss_tts/ggml/rpc.py): a backend
    whose memory is not this process's. Fixtures holding tensors on it close before it does."""
    from moss_tts.ggml.rpc import LocalServer

    with LocalServer(threads=1) as server:
        yield server
