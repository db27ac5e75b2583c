"""What the server tests share: `served(app, limits, sndbuf=...)` runs an app on a loopback
port and stops it after the test; `serve(**settings)` does so for a StubTTS with its voices
under tmp_path (helpers.py settings: ServerSettings fields)."""

import pytest

from moss_tts.server import create_app
from tests.server.helpers import Served, StubTTS, settings


@pytest.fixture
def served():
    """`served(app, *Served args)` → a running Served; `served.stop_all()` stops them (done at
    teardown; a fixture that owns the models calls it first, before closing them)."""
    started = []

    def start(app, *args, **kwargs) -> Served:
        started.append(Served(app, *args, **kwargs))
        return started[-1]

    def stop_all():
        for s in started:
            s.stop()
    start.stop_all = stop_all
    yield start
    stop_all()


@pytest.fixture
def serve(tmp_path, served):
    return lambda **kwargs: served(create_app(StubTTS(), settings(tmp_path / "voices",
                                              **kwargs)))
