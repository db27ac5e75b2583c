"""Backends the ggml tests of the device path share: ggml's RPC backend (a CPU behind the
session's local RPC server, memory not this process's) and the CPU it is compared with."""

import pytest

from moss_tts.ggml import Backend


@pytest.fixture(scope="module")
def rpc(rpc_server):
    with Backend(rpc_server.name) as backend:
        yield backend


@pytest.fixture(scope="module")
def cpu():
    with Backend("cpu", threads=1) as backend:
        yield backend
