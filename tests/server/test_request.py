"""Request limits before any work: the body limit holds while reading (a raw socket sends only
part of a huge body and still gets its 413), and the parsers' field rules."""

import json
import socket

import pytest

from moss_tts.server import create_app
from moss_tts.server.request import (MAX_BODY_BYTES, RequestError, parse_speech, parse_voice)
from tests.server.helpers import Served, StubTTS, settings


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Served(create_app(StubTTS(), settings(tmp_path_factory.mktemp("voices"))))
    yield s
    s.stop()


def status_of(sock) -> int:
    sock.settimeout(10)
    head = b""
    while b"\r\n" not in head:
        part = sock.recv(4096)
        if not part:
            break
        head += part
    return int(head.split()[1])


@pytest.mark.parametrize("path", ["/v1/audio/speech", "/v1/audio/voices"])
def test_an_oversized_declared_body_is_refused_before_it_is_sent(server, path):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n{\"input\": \""
                     % (path.encode(), server.port, 50 * 2**20))
        assert status_of(sock) == 413      # 50 MB declared, a dozen bytes sent


def test_an_undeclared_chunked_body_is_cut_off_at_the_limit(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     % server.port)
        piece = b"x" * 2**20
        for _ in range(MAX_BODY_BYTES // len(piece) + 2):   # past the limit, never finished
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        assert status_of(sock) == 413      # answered while the body is still open


def test_a_body_within_the_limit_with_an_unknown_field_is_400_not_200(server):
    import urllib.error
    import urllib.request
    body = json.dumps({"input": "hi", "response_format": "pcm", "padding": "y" * 2**20}).encode()
    req = urllib.request.Request(server.url + "/v1/audio/speech", data=body,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and "padding" in json.loads(e.value.read())["error"]["message"]


def test_parse_speech_defaults_follow_openai():
    req = parse_speech(b'{"input": "hi", "model": "tts-1", "voice": "alloy"}')
    assert (req.response_format, req.stream_format, req.pcm_layout, req.speed, req.knobs) == \
        ("mp3", None, "openai", 1.0, {})
    assert parse_speech(b'{"input": "hi", "stream_format": "sse"}').response_format == "pcm"
    assert parse_speech(b'{"input": "hi", "seed": 4294967295}').knobs == {"seed": 2**32 - 1}


def test_parse_voice_rejects_non_string_names_instead_of_stringifying_them():
    for raw in (b'{"name": null, "audio": "AAAA"}', b'{"name": 5, "audio": "AAAA"}'):
        with pytest.raises(RequestError, match="'name' must be a string"):
            parse_voice(raw)


def test_aac_without_pyav_is_a_clear_400(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "av", None)   # import av → ImportError
    with pytest.raises(RequestError, match="pip install av") as e:
        parse_speech(b'{"input": "hi", "response_format": "aac"}')
    assert e.value.status == 400


def test_mp3_without_libsndfile_mp3_is_a_clear_400(monkeypatch):
    import soundfile as sf
    monkeypatch.setattr(sf, "available_subtypes", lambda container=None: {})
    with pytest.raises(RequestError, match="libsndfile >= 1.1"):
        parse_speech(b'{"input": "hi", "response_format": "mp3"}')
