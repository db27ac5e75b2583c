"""What the tests of the device path (a backend whose memory is not the host's) need: ggml's RPC
backend, built with MOSS_TTS_GGML_RPC=1 (the `rpc_server` fixture in tests/conftest.py)."""

import pytest

from moss_tts.ggml import lib

needs_rpc = pytest.mark.skipif(
    "rpc" not in lib.get().backends,
    reason="ggml was built without its RPC backend: rebuild with MOSS_TTS_GGML_RPC=1 "
           "(`MOSS_TTS_GGML_RPC=1 python -m ggml_build`) to test the device path on the CPU")
