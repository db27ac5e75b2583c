"""What the server tests share: `serve(**create_app keywords)` starts a loopback server over a
StubTTS with its voices under tmp_path, stopped after the test."""

import pytest

from moss_tts.server import create_app
from tests.server.helpers import Served, StubTTS


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(**kwargs):
        s = Served(create_app(StubTTS(), voices_root=tmp_path / "voices", **kwargs))
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()
