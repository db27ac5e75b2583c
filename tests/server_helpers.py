"""Shared by the server tests and bench/serve_soak.py: uvicorn on loopback, a JSON client, and
the tiny Nano model behind it."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

from converters.codec import convert as convert_codec
from converters.nano import convert as convert_nano
from fixtures.make_codec import make_tiny_nano_checkpoint
from fixtures.make_nano import make_tiny_nano_tts_checkpoint
from fixtures.make_spm import make_tiny_spm

SR = 1600  # the tiny codec's rate


class Served:
    """uvicorn in a thread on an ephemeral loopback port; stopped at teardown."""

    def __init__(self, app):
        import uvicorn
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def call(url, path, body=None, method=None, headers=None, data=None, timeout=60):
    """(status, lower-case headers, body bytes); a JSON body unless raw `data` is given."""
    if data is None and body is not None:
        data = json.dumps(body).encode()
    sent = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers=sent | (headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def tiny_model_files(d, rate=SR):
    """(nano.gguf, codec.gguf) of the tiny fixture model at `rate`, converted under `d`."""
    codec_dir = make_tiny_nano_checkpoint(d / "codec", seed=1)
    if rate != SR:  # the codec's windows scale with the rate; the towers are unchanged
        config = json.loads((codec_dir / "config.json").read_text())
        config["sampling_rate"] = config["sample_rate"] = rate
        (codec_dir / "config.json").write_text(json.dumps(config))
    tts_dir = make_tiny_nano_tts_checkpoint(d / "tts", seed=0,
                                            tokenizer_model_bytes=make_tiny_spm(),
                                            audio_tokenizer_sample_rate=rate, stop_bias=-50)
    return convert_nano(tts_dir, d / "nano.gguf"), convert_codec(codec_dir, d / "codec.gguf")
