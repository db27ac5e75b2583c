"""A model served from a child process (moss_tts/server/hosted.py, issue 31 finding 2), on the CPU
here (the RPC backend's loss is tests/faults/test_backend_death.py): it speaks as the same model
in this process, bit for bit, its warnings and errors arrive as their own classes, it decodes
streams together, and a child that dies is lost for its requests only until a new one loads."""

import os
import signal
import time

import numpy as np
import pytest

from moss_tts import load_tts
from moss_tts.errors import BackendLost, BudgetWarning, InputError
from moss_tts.server.hosted import HostedModel, HostSpec, describe

from .helpers import tiny_model_files

SAFETY_S = 120


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tiny_model_files(tmp_path_factory.mktemp("hosted"))


@pytest.fixture(scope="module")
def local(files):
    with load_tts(str(files[0]), codec=str(files[1]), threads=1) as tts:
        yield tts


@pytest.fixture
def host(files):
    hosted = HostedModel(HostSpec(str(files[0]), str(files[1]), "cpu", 1), "tiny")
    yield hosted
    hosted.close()


def audio(stream) -> np.ndarray:
    return np.concatenate(list(stream))


def test_a_hosted_model_speaks_warns_and_fails_as_the_model_here(host, local):
    assert describe(host) == describe(local)
    with pytest.warns(BudgetWarning) as heard:
        got = audio(host.stream("Hello there.", seed=1, max_frames=12))
    assert heard[0].message.keyword == "max_frames"      # the knob, for the front end's name
    with pytest.warns(BudgetWarning):
        want = audio(local.stream("Hello there.", seed=1, max_frames=12))
    np.testing.assert_array_equal(got, want)
    with pytest.raises(InputError, match="max_frames") as here:
        local.stream("Hi.", max_frames=0)
    with pytest.raises(InputError) as there:
        host.stream("Hi.", max_frames=0)
    assert str(there.value) == str(here.value)
    ref = host.encode_reference(np.zeros((1600, 2), np.float32) + 0.1, 1600)
    np.testing.assert_array_equal(ref.codes, local.encode_reference(
        np.zeros((1600, 2), np.float32) + 0.1, 1600).codes)


def test_streams_decoded_together_in_the_child_equal_each_alone(host, local):
    requests = [("Hello there.", 3, 10), ("Another one, longer.", 4, 7)]
    with pytest.warns(BudgetWarning):
        want = [audio(local.stream(t, seed=s, max_frames=n)) for t, s, n in requests]
        with host.decoding_together(2):
            streams = [host.stream(t, seed=s, max_frames=n) for t, s, n in requests]
            parts = [[], []]
            while any(s is not None for s in streams):   # pulled in turn, as the worker does
                for i, stream in enumerate(streams):
                    if stream is not None:
                        try:
                            parts[i].append(next(stream))
                        except StopIteration:
                            streams[i] = None
    for got, expected in zip(parts, want):
        np.testing.assert_array_equal(np.concatenate(got), expected)


def test_a_lost_child_fails_its_requests_until_a_new_one_has_loaded(host, local):
    stream = host.stream("Hello there, a long one.", seed=2, max_frames=40)
    next(stream)
    os.kill(host._process.pid, signal.SIGKILL)           # its backend gone with it
    with pytest.raises(BackendLost, match="model tiny is unavailable"):
        next(stream)
    assert not host.available and host.status()["problem"]
    with pytest.raises(BackendLost):
        host.stream("Hi.", max_frames=3)
    deadline = time.monotonic() + SAFETY_S
    while not host.available and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host.available and host.status() == {"available": True}
    with pytest.raises(BackendLost):                     # a stream of the lost child stays lost
        next(stream)
    with pytest.warns(BudgetWarning):
        np.testing.assert_array_equal(audio(host.stream("Hi.", seed=1, max_frames=5)),
                                      audio(local.stream("Hi.", seed=1, max_frames=5)))


def test_a_dropped_handle_to_a_part_of_the_model_leaves_it_open(host, local):
    """What an attribute read lends (the codec) belongs to the model: the parent dropping its
    handle must not close it there, as dropping a stream closes the stream."""
    rate = host.codec.sample_rate          # a handle to the child's codec, read and dropped
    assert rate == local.codec.sample_rate
    import gc

    gc.collect()
    with pytest.warns(BudgetWarning):
        np.testing.assert_array_equal(audio(host.stream("Hi.", seed=1, max_frames=5)),
                                      audio(local.stream("Hi.", seed=1, max_frames=5)))


def test_a_live_session_in_the_child_speaks_as_one_here(tmp_path):
    """A hosted MOSS-TTS-Realtime model's live session (a handle: its methods and attributes
    the child's) speaks as the same session in this process."""
    from moss_tts.live import push_as_typed

    from .helpers import tiny_realtime_files

    model, codec = (str(f) for f in tiny_realtime_files(tmp_path))
    heard = []
    with load_tts(model, codec=codec, threads=1) as local:
        host = HostedModel(HostSpec(model, codec, "cpu", 1), "rt")
        try:
            for tts in (local, host):
                session = tts.session(seed=3)
                chunks = list(push_as_typed(session, "Hello there, how are you?"))
                session.end_text()
                chunks += list(session.drain())
                heard.append((np.concatenate(chunks), session.rows, session.max_turn_chars))
                session.close()
        finally:
            host.close()
    assert heard[0][0].size and np.array_equal(heard[0][0], heard[1][0])
    assert heard[0][1:] == heard[1][1:]
