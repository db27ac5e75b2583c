"""Every family on a backend whose memory is not the host's (ggml's RPC backend serving the CPU
from another process, moss_tts/ggml/rpc.py): weights uploaded, KV caches and graphs there, inputs
and outputs copied per step. The server runs the same CPU kernels, so the codes and the audio
equal the CPU backend's exactly (issue 26)."""

import warnings

import numpy as np
import pytest

from moss_tts.errors import BudgetWarning
from moss_tts.ggml import Backend
from moss_tts.models.nano_tts import Reference
from moss_tts.sampling import SamplingOptions

from .conftest import THREADS, seeded_codes
from .test_contract import CLASSES, FAMILIES, TEXT, clip, files, small  # noqa: F401

GREEDY = SamplingOptions(do_sample=False, audio_repetition_penalty=1.0)


@pytest.fixture(scope="module")
def rpc(rpc_server):
    with Backend(rpc_server.name) as backend:
        yield backend


def loaded_once(files, **load):
    """family → its TTS with model and codec loaded with `load` (once per family); closes
    them all when the generator is closed."""
    made = {}

    def get(family):
        if family not in made:
            model, codec = files[family]
            made[family] = CLASSES[family].load(model, codec=codec, **load)
        return made[family]

    try:
        yield get
    finally:
        for tts in made.values():
            tts.close()


@pytest.fixture(scope="module")
def on_rpc(files, rpc):
    """family → its TTS with model and codec on the RPC backend, loaded once."""
    yield from loaded_once(files, backend=rpc)


@pytest.fixture(scope="module")
def on_cpu(files):
    yield from loaded_once(files, threads=THREADS)


def speak(tts, family, **kw):
    if family == "local":
        kw["chunk_frames"] = 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BudgetWarning)
        return tts.synthesize(TEXT, seed=3, **small(family), **kw)[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_model_and_codec_live_off_the_host(on_rpc, on_cpu, family):
    tts = on_rpc(family)
    rpc_weights = [tts.model.weights, tts.codec.weights]
    assert not any(w.zero_copy for w in rpc_weights)
    assert not any(w[w.names()[0]].on_host for w in rpc_weights)
    cpu = on_cpu(family)
    assert cpu.model.weights.zero_copy and cpu.model.weights[cpu.model.weights.names()[0]].on_host


@pytest.mark.parametrize("family", FAMILIES)
def test_sampled_speech_on_rpc_equals_cpu(on_rpc, on_cpu, family):
    got, want = speak(on_rpc(family), family), speak(on_cpu(family), family)
    assert want.size > 0 and np.abs(want).max() > 0, "silence: the comparison would be vacuous"
    np.testing.assert_array_equal(got, want, err_msg=family)


@pytest.mark.parametrize("family", FAMILIES)
def test_cloned_speech_on_rpc_equals_cpu(on_rpc, on_cpu, family):
    # the reference goes through the codec's encoder on each backend
    tts = on_rpc(family)
    ref = tts.encode_reference(*clip(tts))
    np.testing.assert_array_equal(ref.codes, on_cpu(family).encode_reference(*clip(tts)).codes)
    got = speak(tts, family, reference=ref)
    want = speak(on_cpu(family), family, reference=ref)
    np.testing.assert_array_equal(got, want, err_msg=family)
    # guard: the reference changes the speech, so the clone path was exercised
    assert got.shape != speak(tts, family).shape or (got != speak(tts, family)).any()


def test_nano_greedy_codes_on_rpc_equal_cpu(on_rpc, on_cpu):
    rows = on_cpu("nano").plan(TEXT, reference=Reference(seeded_codes(6, seed=1)))[0][1]
    want = on_cpu("nano").generate(rows, options=GREEDY, max_frames=24)
    got = on_rpc("nano").generate(rows, options=GREEDY, max_frames=24)
    assert len(want) == 24 and len(np.unique(want)) > 1
    np.testing.assert_array_equal(got, want)



def test_nano_streams_decoded_together_on_rpc_equal_cpu(on_rpc, on_cpu):
    """Several streams per step (models/batching.py): the shared caches on the device too."""
    requests = [{"text": TEXT, "seed": 3, "max_frames": 6},
                {"text": "Fine, thanks.", "seed": 4, "max_frames": 4}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BudgetWarning)
        got = on_rpc("nano").synthesize_many(requests, max_streams=2)
        want = on_cpu("nano").synthesize_many(requests, max_streams=2)
    assert len(got) == len(want) == 2
    assert want[0][0].shape != want[1][0].shape or (want[0][0] != want[1][0]).any()
    for (a, _), (b, _) in zip(got, want):
        np.testing.assert_array_equal(a, b)


# ops every family uses: the scheduler runs them on the CPU, the rest on the server, with the
# copies between them at every switch
LACKED = frozenset({"MUL_MAT", "SOFT_MAX", "FLASH_ATTN_EXT", "ROPE"})


@pytest.mark.parametrize("family", FAMILIES)
def test_a_device_lacking_ops_falls_back_to_the_cpu_and_speaks_the_same(files, rpc_server,
                                                                        on_cpu, family):
    model, codec = files[family]
    with Backend(rpc_server.name, lacks=LACKED) as lacking, \
            CLASSES[family].load(model, codec=codec, backend=lacking) as tts:
        got = speak(tts, family)
    np.testing.assert_array_equal(got, speak(on_cpu(family), family), err_msg=family)

# --- MossTTSDelay's published checkpoints (TTSD, VoiceGenerator, SoundEffect) ----------------
PUBLISHED = {"ttsd": {"text": "[S1] Hello there. [S2] Fine, thanks."},
             "voicegen": {"text": TEXT, "instruction": "a calm, low voice"},
             "sfx": {"text": "Rain on a tin roof."}}


@pytest.mark.parametrize("kind", list(PUBLISHED))
def test_published_delay_checkpoints_on_rpc_equal_cpu(published_files, v1_codec_gguf, rpc, kind):
    from moss_tts.models.registry import family_of_model

    gguf = published_files(kind)[2]
    tts_class = family_of_model(gguf).tts_class()
    out = []
    for backend in (rpc, Backend("cpu", threads=THREADS)):
        with tts_class.load(gguf, codec=v1_codec_gguf, backend=backend) as tts, \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", BudgetWarning)
            out.append(tts.synthesize(**PUBLISHED[kind], seed=3,
                                      **{tts_class.BUDGET.keyword: 12})[0])
    assert out[1].size > 0 and np.abs(out[1]).max() > 0
    np.testing.assert_array_equal(out[0], out[1], err_msg=kind)


def test_published_llama_cpp_layout_on_rpc_equals_cpu(tmp_path, rpc):
    """Its numpy tables go to the backend through a TensorStore beside the GGUF's weights."""
    from fixtures.make_delay import make_state, make_tokenizer_json, tiny_config, write_published_layout
    from moss_tts.models.delay_published import load_published
    from moss_tts.sampling import DelaySamplingOptions

    from .test_delay import prompt_rows

    d = write_published_layout(tmp_path, make_state(tiny_config(), 2, 4.0), tiny_config(),
                               make_tokenizer_json())
    greedy = DelaySamplingOptions().greedy()
    out = []
    for backend in (rpc, Backend("cpu", threads=THREADS)):
        model = load_published(d, backend)
        try:
            out.append(model.generate(prompt_rows(), options=greedy, max_new_rows=10))
        finally:
            model.close()
    assert len(out[1]) > 0
    np.testing.assert_array_equal(out[0], out[1])
