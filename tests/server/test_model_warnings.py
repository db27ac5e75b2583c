"""What a model warns while it serves a request (issue 31, finding 9): one line in the server's
log naming the request (its client and model) and the field to raise as the request spells
it, not Python's warning on stderr; a warning of a thread that serves no request is left to
Python (guard)."""

import logging
import threading
import warnings

import pytest

from moss_tts.errors import BudgetWarning
from moss_tts.server import create_app

from .helpers import StubTTS, call, client_of, settings
from .test_max_streams_live import files, together  # noqa: F401 (fixtures)


class CuttingTTS(StubTTS):
    """The stub's three chunks, then the frame budget's warning, as a family's stream gives
    it after its last chunk."""

    def stream(self, text, reference=None, **kwargs):
        yield from super().stream(text, reference, **kwargs)
        warnings.warn(BudgetWarning(f"{text}: the audio is cut — raise max_frames\n(detail)",
                                    "max_frames"))


@pytest.mark.filterwarnings("always::moss_tts.errors.BudgetWarning")
@pytest.mark.parametrize("streamed", [False, True])
def test_a_models_warning_is_one_log_line_naming_the_request(streamed, served, tmp_path,
                                                            caplog, recwarn):
    server = served(create_app({"stub": CuttingTTS()}, settings(tmp_path / "v")))
    extra = {"stream_format": "audio"} if streamed else {}
    with caplog.at_level(logging.WARNING, logger="moss_tts"):
        for text in ("first", "second"):
            r = client_of(server).audio.speech.create(model="stub", voice="alloy", input=text,
                                                      response_format="pcm", extra_body=extra)
            assert len(r.content) > 0
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("moss_tts.server")]
    assert len(lines) == 2, lines
    for text, line in zip(("first", "second"), lines):
        assert line.startswith("speech for 127.0.0.1:") and "(model stub): " in line
        assert line.endswith(f"{text}: the audio is cut — raise 'max_frames' (detail)")
    assert not [w for w in recwarn if issubclass(w.category, BudgetWarning)]


@pytest.mark.filterwarnings("always::moss_tts.errors.BudgetWarning")
def test_a_warning_outside_any_request_is_left_to_python(served, tmp_path, caplog):
    """Guard: the hook routes only what a request's pull warns."""
    server = served(create_app(CuttingTTS(), settings(tmp_path / "v")))
    assert call(server.url, "/health")[0] == 200
    with pytest.warns(BudgetWarning, match="elsewhere"), \
            caplog.at_level(logging.WARNING, logger="moss_tts"):
        worker = threading.Thread(target=warnings.warn, args=(BudgetWarning("elsewhere"),))
        worker.start()
        worker.join()
    assert not [r for r in caplog.records if "elsewhere" in r.getMessage()]


@pytest.mark.filterwarnings("always::moss_tts.errors.BudgetWarning")
def test_a_live_sessions_warning_is_one_log_line_naming_the_session(recwarn, caplog,
                                                                    together):
    """A live turn cut at its budget: its warning is logged as the session's (its client and
    model), as a request's is, not printed on stderr (the server starts after recwarn's
    capture, as a server starts after Python's own, so its hook sits above it)."""
    import contextlib
    import json

    from .test_max_streams_live import live_session

    server, _ = together
    with caplog.at_level(logging.WARNING, logger="moss_tts"), contextlib.ExitStack() as stack:
        ws = live_session(server, stack)
        ws.send(json.dumps({"type": "text", "text": "Spoken live, and cut."}))
        ws.send(json.dumps({"type": "end"}))
        while isinstance(m := ws.recv(timeout=60), bytes):
            pass
        assert json.loads(m)["type"] == "turn_done"
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("moss_tts.server")]
    assert any(line.startswith("live session for 127.0.0.1:") and "raise" in line
               for line in lines), lines
    assert not [w for w in recwarn if issubclass(w.category, BudgetWarning)]
