"""ggml_build/toolchain.py: the MOSS_TTS_GGML_* switches become CMake flags."""

import pytest

from ggml_build.proc import GgmlBuildError
from ggml_build.toolchain import ENV_FLAGS, EXTRA_ARGS_ENV, cmake_flags


@pytest.fixture
def clean_env(monkeypatch):
    for var in list(ENV_FLAGS) + [EXTRA_ARGS_ENV]:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_the_default_build_has_the_rpc_backend_without_rdma(clean_env):
    """On by default, so the device path is tested on every machine (tests/ggml/test_rpc.py)."""
    flags, extra = cmake_flags()
    assert flags["GGML_RPC"] == "ON" and flags["GGML_RPC_RDMA"] == "OFF"
    assert flags["GGML_CUDA"] == "OFF" and extra == []


@pytest.mark.parametrize("value", ["1", "on", "TRUE", "yes"])
def test_rpc_switch_turns_on_the_rpc_backend_without_rdma(clean_env, value):
    clean_env.setenv("MOSS_TTS_GGML_RPC", value)
    flags, _ = cmake_flags()
    assert flags["GGML_RPC"] == "ON" and flags["GGML_RPC_RDMA"] == "OFF"


@pytest.mark.parametrize("value", ["0", "off", "no"])
def test_rpc_switch_off_adds_nothing(clean_env, value):
    clean_env.setenv("MOSS_TTS_GGML_RPC", value)
    assert "GGML_RPC" not in cmake_flags()[0]


def test_cmake_args_override_the_rpc_transport(clean_env):
    clean_env.setenv("MOSS_TTS_GGML_RPC", "1")
    clean_env.setenv(EXTRA_ARGS_ENV, "-DGGML_RPC_RDMA=ON")
    assert cmake_flags()[0]["GGML_RPC_RDMA"] == "ON"


def test_a_bad_switch_value_is_refused(clean_env):
    clean_env.setenv("MOSS_TTS_GGML_RPC", "maybe")
    with pytest.raises(GgmlBuildError, match="MOSS_TTS_GGML_RPC='maybe'"):
        cmake_flags()
