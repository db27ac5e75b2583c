import numpy as np
import pytest


@pytest.fixture
def rng():
    """Seeded randomness: never all zeros or ones (style C28a)."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def tiny_codec(tmp_path_factory):
    """variant ("v1": 24 kHz-style mono, "v2" or "nano": 48 kHz-style stereo), seed → the GGUF
    of that tiny codec (fixtures/make_codec.py through the real converter, style C30), made once
    a session and shared: read it, never write it (a test that needs its own copies it)."""
    from fixtures.make_codec import make_tiny_codec_gguf

    made = {}

    def gguf(variant: str = "v1", *, seed: int = 0):
        if (variant, seed) not in made:
            made[variant, seed] = make_tiny_codec_gguf(
                tmp_path_factory.mktemp(f"tiny_codec_{variant}_{seed}"), variant, seed=seed)
        return made[variant, seed]
    return gguf


# a device backend (`cuda`, `rpc://HOST:PORT`) for the op tables and the device model tests
# (tests/ggml/test_ops.py, tests/models/test_device_backend.py); bench/gpu_check.sh sets it
TEST_BACKEND_ENV = "MOSS_TTS_TEST_BACKEND"
RPC_ACCEPTED = "Accepted client connection"    # ggml's RPC server, per client


@pytest.fixture(scope="session")
def rpc_server():
    """A ggml RPC server serving the CPU in a child process (moss_tts/ggml/rpc.py): a backend
    whose memory is not this process's. Fixtures holding tensors on it close before it does."""
    import time

    from moss_tts.ggml.rpc import LocalServer

    with LocalServer(threads=1) as server:
        # the server prints a line per client it accepts (tests count them): wait for its
        # readiness probe's, so no later count takes it for a test's client
        while RPC_ACCEPTED not in server.output():
            time.sleep(0.05)
        yield server
