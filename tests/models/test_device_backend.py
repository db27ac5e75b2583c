"""Every family on the device named by $MOSS_TTS_TEST_BACKEND (`cuda` when bench/gpu_check.sh
runs it on a GPU), else on ggml's RPC backend serving the CPU from another process: the same
speech as the CPU within DEVICE_AUDIO_ATOL, and exactly on RPC (the same kernels). The fuller
RPC suite is test_rpc_backend.py; this is the set a GPU check runs (issue 26)."""

import os

import numpy as np
import pytest

from fixtures.compare import assert_close
from moss_tts.ggml import Backend
from moss_tts.ggml.rpc import is_rpc_name
from tests.conftest import TEST_BACKEND_ENV

from .conftest import THREADS
from .test_contract import CLASSES, FAMILIES, clip, files  # noqa: F401
from .test_rpc_backend import LACKED, loaded_once, speak

# A GPU's f32 kernels sum in other orders (cuBLAS GEMM tiles, parallel reductions) and its
# expf/tanhf differ by an ulp or two: ~1e-6 per op, grown through the tiny models' few layers
# and the codec towers to well under 1e-4 of full scale; the bound leaves a 10x margin. A sampled
# or argmax token that flips on such a difference fails loudly (whole frames differ), not here.
DEVICE_AUDIO_ATOL = 1e-3


@pytest.fixture(scope="module")
def device_name(request):
    return os.environ.get(TEST_BACKEND_ENV) or request.getfixturevalue("rpc_server").name


@pytest.fixture(scope="module")
def atol(device_name):
    return 0.0 if is_rpc_name(device_name) else DEVICE_AUDIO_ATOL


@pytest.fixture(scope="module")
def device(device_name):
    with Backend(device_name, threads=THREADS) as backend:
        yield backend


@pytest.fixture(scope="module")
def loaded(files, device):
    """(family, "device" | "cpu") → its TTS, loaded once."""
    sides = {"device": loaded_once(files, backend=device),
             "cpu": loaded_once(files, threads=THREADS)}
    gets = {where: next(side) for where, side in sides.items()}
    yield lambda family, where: gets[where](family)
    for side in sides.values():
        side.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_sampled_speech_on_the_device_equals_cpu(loaded, atol, family):
    tts = loaded(family, "device")
    assert not tts.model.weights.zero_copy      # uploaded: the device path, not the host's
    want = speak(loaded(family, "cpu"), family)
    assert want.size > 0 and np.abs(want).max() > 0, "silence: the comparison would be vacuous"
    assert_close(speak(tts, family), want, atol=atol, what=f"{family} speech")


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_codes_on_the_device_equal_cpu(loaded, family):
    tts = loaded(family, "device")
    got = tts.encode_reference(*clip(tts)).codes
    want = loaded(family, "cpu").encode_reference(*clip(tts)).codes
    assert len(np.unique(want)) > 1
    np.testing.assert_array_equal(got, want, err_msg=family)


@pytest.mark.parametrize("family", FAMILIES)
def test_ops_the_device_is_said_to_lack_run_on_the_cpu_with_the_same_speech(files, device_name,
                                                                          loaded, atol, family):
    model, codec = files[family]
    with Backend(device_name, threads=THREADS, lacks=LACKED) as lacking, \
            CLASSES[family].load(model, codec=codec, backend=lacking) as tts:
        got = speak(tts, family)
    assert_close(got, speak(loaded(family, "cpu"), family), atol=atol, what=f"{family} speech")
