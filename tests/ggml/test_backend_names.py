"""Backend names (moss_tts/ggml/backend.py, issue 31 finding 10): an empty name, a name ggml does
not know, and a backend ggml has that this build lacks are each one error saying what this
build has and, for the last, the MOSS_TTS_GGML_* switch of docs/build.md that adds it; nothing
falls back to the CPU. The same on every surface: `Backend`, `get_backend` (what `load_tts`,
`Codec.load` and every TTS class's `load` call) and `check_name` (the CLI's and batch's check)."""

import re
from pathlib import Path

import pytest

from ggml_build.toolchain import ENV_FLAGS
from moss_tts.errors import BackendError, InputError
from moss_tts.ggml import Backend, get_backend, lib
from moss_tts.ggml.backend import check_name, devices, devices_missing

ROOT = Path(__file__).resolve().parents[2]
# ggml_build's switches that add a backend (its ENV_FLAGS; the others tune the CPU build or add
# RPC, which is named rpc://HOST:PORT): kind → what a user sets
SWITCHES = {option[len("GGML_"):].lower(): f"{var}=1"
            for var, (option, _) in ENV_FLAGS.items()
            if option not in ("GGML_NATIVE", "GGML_OPENMP", "GGML_RPC")}


def built() -> set[str]:
    return lib.get().backends


def error_of(name) -> str:
    with pytest.raises(BackendError) as e:
        get_backend(name)
    message = str(e.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("name", ["", " ", "\t"])
def test_an_empty_backend_name_is_refused_not_taken_for_the_cpu(name):
    message = error_of(name)
    assert message.startswith(f"backend {name!r} is empty") and "cpu" in message, message
    with pytest.raises(BackendError, match="is empty"):
        Backend(name)
    assert get_backend(None).is_cpu          # leaving it out is the CPU


@pytest.mark.parametrize("name", ["nonsense", "nosuchbackend", "gpu"])
def test_an_unknown_name_lists_what_this_build_has_and_no_build_switch(name):
    message = error_of(name)
    assert message.startswith(f"backend {name!r} is not a ggml backend: this build has cpu"), \
        message
    assert "MOSS_TTS_GGML" not in message, message
    if "rpc" in built():
        assert "rpc://HOST:PORT" in message


@pytest.mark.parametrize("kind, switch", sorted(SWITCHES.items()))
def test_a_backend_this_build_lacks_names_its_own_build_switch(kind, switch):
    if kind in built():
        pytest.skip(f"this build has {kind}")
    for name in (kind, kind.upper(), f"{kind}1"):
        message = error_of(name)
        assert f"rebuild ggml with {switch} " in message and "docs/build.md" in message, message
        others = set(SWITCHES.values()) - {switch}
        assert not any(o in message for o in others), message     # CUDA advised for Vulkan


def test_a_backend_without_a_switch_names_the_cmake_argument():
    if "sycl" in built():
        pytest.skip("this build has sycl")
    assert "MOSS_TTS_GGML_CMAKE_ARGS=-DGGML_SYCL=ON" in error_of("sycl")


def test_a_device_index_past_the_devices_names_the_ones_there():
    assert "CPU devices: cpu0" in error_of("cpu1")
    assert get_backend("cpu0").is_cpu and get_backend("CPU").is_cpu


def test_the_switches_are_the_build_tools_and_the_docs():
    """The switches the errors advise are those ggml_build reads and docs/build.md lists."""
    from moss_tts.ggml.backend import BUILD_SWITCHES

    assert BUILD_SWITCHES == SWITCHES
    docs = (ROOT / "docs" / "build.md").read_text()
    for switch in SWITCHES.values():
        assert re.search(rf"\| `{switch.split('=')[0]}` \|", docs), switch


@pytest.mark.parametrize("name, said", [
    ("", "--backend '' is empty"),
    ("vulkan", "--backend 'vulkan' is not in this ggml build"),
    ("nonsense", "--backend 'nonsense' is not a ggml backend"),
    ("rpc", "--backend 'rpc': name an RPC server as rpc://HOST:PORT"),
])
def test_check_name_names_the_flag_it_was_given_as(name, said):
    if name == "vulkan" and name in built():
        pytest.skip("this build has vulkan")
    with pytest.raises(InputError) as e:
        check_name(name, flag="--backend")
    assert str(e.value).startswith(said), str(e.value)
    with pytest.raises(BackendError):
        check_name(name)


# ggml_cuda_init's line where the CUDA runtime finds no driver (issue 35: the CUDA build run on a
# machine without a GPU); ggml logs it once, while registering its backends
CUDA_INIT_FAILED = ("ggml_cuda_init: failed to initialize CUDA: CUDA driver version is "
                    "insufficient for CUDA runtime version")


@pytest.fixture
def cuda_without_device(monkeypatch):
    """This build as a CUDA build on a machine with no GPU or driver: `cuda` in the manifest's
    backends, no CUDA device registered, and ggml's registration line kept by the binding."""
    L = lib.get()
    if any(d.registry == "CUDA" for d in devices()):
        pytest.skip("this machine has a CUDA device")
    monkeypatch.setattr(L, "backends", L.backends | {"cuda"})
    monkeypatch.setattr(L, "registration_problem", CUDA_INIT_FAILED)
    return "failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version"


def test_a_built_backend_with_no_device_says_why_in_one_line(cuda_without_device):
    """--backend cuda on a CUDA build without a GPU: one line with ggml's reason, not a list of
    backends that names cuda as if it ran here."""
    said = f"this ggml build has CUDA but finds no CUDA device on this machine ({cuda_without_device})"
    with pytest.raises(InputError) as e:
        check_name("cuda", flag="--backend")
    assert str(e.value) == f"--backend 'cuda': {said}: leave it out for the CPU", str(e.value)
    assert error_of("cuda1") == f"backend 'cuda1': {said}: leave it out for the CPU"
    assert devices_missing() == {"cuda": cuda_without_device}


def test_a_registration_line_about_another_backend_is_not_given_as_the_reason(
        cuda_without_device, monkeypatch):
    monkeypatch.setattr(lib.get(), "registration_problem", "ggml_vulkan: no device found")
    assert devices_missing() == {"cuda": ""}
    assert error_of("cuda").endswith("finds no CUDA device on this machine: leave it out for the CPU")


def test_the_cpu_and_rpc_are_never_missing_a_device():
    # the CPU always has its device; an RPC server's is added when one is named
    missing = devices_missing()
    assert "cpu" not in missing and "rpc" not in missing, missing
