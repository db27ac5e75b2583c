"""Who may talk to the speech server: Host allow-list, foreign Origins (and one Origin header at
most), JSON-only POSTs, the API key, CORS and the access log, against a real uvicorn on loopback
(a stub stands in for the model; nothing here reaches it unless allowed)."""

import asyncio
import http.client
import json
import logging

import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from moss_tts.server.access import Gate, split_host
from tests.server.helpers import call, silent_wav_b64

SPEECH = {"model": "tts-1", "input": "hi", "response_format": "pcm"}


@pytest.fixture
def open_server(serve):
    return serve()


@pytest.mark.parametrize("host,ok", [
    ("127.0.0.1:{port}", True), ("localhost:{port}", True), ("[::1]:{port}", True),
    ("LOCALHOST:{port}", True), ("evil.example:{port}", False), ("127.0.0.1:1", False),
    ("127.0.0.1", False), ("localhost.evil.example:{port}", False), ("", False)])
def test_only_loopback_host_names_are_served(open_server, host, ok):
    st, _, raw = call(open_server.url, "/health",
                      headers={"Host": host.format(port=open_server.port)})
    assert st == (200 if ok else 400), raw
    if not ok:
        assert "--allowed-host" in json.loads(raw)["error"]["message"]


def test_allowed_host_adds_a_name(serve):
    s = serve(allowed_hosts=["tts.lan"])
    assert call(s.url, "/health", headers={"Host": f"tts.lan:{s.port}"})[0] == 200
    assert call(s.url, "/health", headers={"Host": f"other.lan:{s.port}"})[0] == 400


def test_a_cross_origin_text_plain_post_creates_nothing(open_server, tmp_path):
    """What any web page can send without a CORS preflight."""
    headers = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    data = json.dumps({"name": "planted", "audio": silent_wav_b64()}).encode()
    st, _, raw = call(open_server.url, "/v1/audio/voices", data=data, headers=headers)
    assert st == 403 and "--cors-origin" in json.loads(raw)["error"]["message"]
    assert not (tmp_path / "voices").exists()


@pytest.mark.parametrize("path,body", [("/v1/audio/voices", {"name": "planted"}),
                                       ("/v1/audio/speech", SPEECH)])
@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", None])
def test_json_posts_need_a_json_content_type(open_server, tmp_path, path, body, ctype):
    body = body | ({"audio": silent_wav_b64()} if "name" in body else {})
    headers = {"Content-Type": ctype} if ctype else {"Content-Type": ""}
    st, _, raw = call(open_server.url, path, data=json.dumps(body).encode(), headers=headers)
    assert st == 415 and "application/json" in json.loads(raw)["error"]["message"]
    assert not (tmp_path / "voices").exists()


def test_json_content_type_with_charset_is_accepted(open_server):
    st, _, _ = call(open_server.url, "/v1/audio/speech", data=json.dumps(SPEECH).encode(),
                    headers={"Content-Type": "application/json; charset=utf-8"})
    assert st == 200


def test_same_origin_requests_from_the_page_are_allowed(open_server):
    st, _, _ = call(open_server.url, "/v1/audio/speech", SPEECH,
                    headers={"Origin": open_server.url})
    assert st == 200


def test_cors_only_for_named_origins(serve):
    s = serve(cors_origins=["http://app.example"])
    st, h, _ = call(s.url, "/v1/audio/speech", SPEECH, headers={"Origin": "http://app.example"})
    assert st == 200 and h["access-control-allow-origin"] == "http://app.example"
    assert "x-audio-sample-rate" in h["access-control-expose-headers"].lower()
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    st, h, _ = call(s.url, "/v1/audio/speech", method="OPTIONS", headers=preflight)
    assert st == 200 and "authorization" in h["access-control-allow-headers"].lower()
    st, h, _ = call(s.url, "/v1/audio/speech", method="OPTIONS",
                    headers=preflight | {"Origin": "http://other.example"})
    assert st == 403 and "access-control-allow-origin" not in h


def test_no_cors_headers_without_cors_origins(open_server):
    st, h, _ = call(open_server.url, "/health")
    assert st == 200 and not any(k.startswith("access-control") for k in h)


KEY = "sk-local-test"


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/v1/audio/speech", SPEECH), ("GET", "/v1/models", None),
    ("GET", "/v1/audio/voices", None), ("DELETE", "/v1/audio/voices/x", None),
    ("POST", "/v1/audio/voices", {"name": "x", "audio": "AAAA"})])
def test_api_key_is_required_on_every_endpoint_but_health(serve, method, path, body):
    s = serve(api_key=KEY)
    for auth in (None, "Bearer wrong", f"Basic {KEY}", KEY):
        st, h, raw = call(s.url, path, body, method=method,
                          headers={"Authorization": auth} if auth else {})
        err = json.loads(raw)["error"]
        assert st == 401 and err["code"] == "invalid_api_key" and h["www-authenticate"] == "Bearer"
    st, _, _ = call(s.url, path, body, method=method, headers={"Authorization": f"Bearer {KEY}"})
    assert st not in (401, 403)
    assert call(s.url, "/health")[0] == 200 and call(s.url, "/")[0] == 200


def test_the_openai_client_sends_the_key_as_a_bearer_token(serve):
    s = serve(api_key=KEY)
    ok = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0)
    assert ok.audio.speech.create(model="tts-1", voice="alloy", input="hi",
                                  response_format="pcm").read()
    wrong = openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.audio.speech.create(model="tts-1", voice="alloy", input="hi")


def test_access_log_has_one_line_per_request(serve, caplog):
    s = serve(access_log=True)
    with caplog.at_level(logging.INFO, logger="moss_tts.access"):
        call(s.url, "/health")
        call(s.url, "/v1/audio/speech", SPEECH | {"seed": "x"})
    lines = [r.getMessage() for r in caplog.records if r.name == "moss_tts.access"]
    assert len(lines) == 2
    assert '"GET /health" 200' in lines[0] and '"POST /v1/audio/speech" 400' in lines[1]
    assert lines[0].startswith("127.0.0.1 ") and lines[0].endswith(" ms")


def test_a_percent_encoded_line_break_in_a_path_cannot_forge_an_access_log_line(serve, caplog):
    """uvicorn decodes the path (%0D%0A is CR LF): the line escapes it, and the quote that
    would end the request field, so the log holds one line per request, as it came."""
    s = serve(access_log=True)
    forged = '/x%0D%0A10.0.0.1%20%22GET%20/admin%22%20200%200%201%20ms%1B[2K'
    with caplog.at_level(logging.INFO, logger="moss_tts.access"):
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("GET", forged)
        answer = conn.getresponse()
        assert answer.status == 404 and answer.read()      # the line is written by then
        conn.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "moss_tts.access"]
    assert len(lines) == 1 and not any(c in lines[0] for c in "\r\n\x1b"), lines
    assert '"GET /x\\r\\n10.0.0.1 \\"GET /admin\\" 200 0 1 ms\\x1b[2K" 404 ' in lines[0]


def test_no_access_log_unless_asked(open_server, caplog):
    with caplog.at_level(logging.INFO, logger="moss_tts.access"):
        call(open_server.url, "/health")
    assert not [r for r in caplog.records if r.name == "moss_tts.access"]


@pytest.mark.parametrize("value,want", [
    ("localhost:8080", ("localhost", 8080)), ("[::1]:80", ("[::1]", 80)),
    ("[::1]", ("[::1]", None)),
    ("Example.COM", ("example.com", None)), ("h:x", ("h", -1)),
    pytest.param("h:" + "9" * 5000, ("h", -1), id="a port too long for int()")])
def test_split_host(value, want):
    assert split_host(value) == want


# --- two Origin headers (issue 23, hole 8): the last one won ------------------------------------


def test_a_request_with_two_origin_headers_is_refused(open_server):
    """A foreign Origin followed by the page's own: refused, whichever order."""
    own = open_server.url
    for origins in (("http://evil.example", own), (own, "http://evil.example"), (own, own)):
        conn = http.client.HTTPConnection("127.0.0.1", open_server.port, timeout=20)
        conn.putrequest("GET", "/v1/models")
        for origin in origins:
            conn.putheader("Origin", origin)
        conn.endheaders()
        r = conn.getresponse()
        assert r.status == 403 and "Origin headers" in json.loads(r.read())["error"]["message"]
        conn.close()


def test_a_websocket_handshake_with_two_origin_headers_is_refused(open_server):
    """On loopback uvicorn's websockets protocol refuses it first (400); the Gate's own check
    is seen below, where no protocol stands in front of it."""
    url = open_server.url.replace("http://", "ws://") + "/v1/audio/live"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers=[("Origin", "http://evil.example"),
                                         ("Origin", open_server.url)]).close()
    assert refused.value.response.status_code in (400, 403)


def test_the_gate_refuses_a_websocket_with_two_origin_headers():
    """A WebSocket scope as a server that passes both headers on (uvicorn's wsproto protocol
    does) hands it to the app: refused with 403, the inner app never reached."""
    reached, sent = [], []

    async def inner(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)
    own = "http://127.0.0.1:8080"
    scope = {"type": "websocket", "path": "/v1/audio/live", "scheme": "ws", "query_string": b"",
             "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 5000),
             "extensions": {"websocket.http.response": {}},
             "headers": [(b"host", b"127.0.0.1:8080"), (b"origin", b"http://evil.example"),
                         (b"origin", own.encode())]}
    gate = Gate(inner, hosts={"127.0.0.1"}, origins=set(), api_key=None)
    asyncio.run(gate(scope, receive, send))
    assert reached == [] and sent[0]["type"] == "websocket.http.response.start"
    assert sent[0]["status"] == 403 and b"Origin headers" in sent[1]["body"]
