import numpy as np
import pytest


@pytest.fixture
def rng():
    """Seeded randomness: never all zeros or ones (style C28a)."""
    return np.random.default_rng(1234)


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
