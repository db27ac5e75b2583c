"""The attacks of issue 31 that bench/serve_soak.py runs beside its load, each against the bound
that must hold it: a stalled and a trickling request body (--body-timeout), a decompression bomb
as `reference_audio` (memory), a no-space live flood on the tiny Realtime model (a turn's text),
clients that ask again at once on an exactly full server (places), every capped field past its
bound (statuses, nothing queued), and a lost RPC backend (503s, /health, the way back). Each
gives a `Held` row: the bound, the figure measured, and whether it held — judged by outcomes
(statuses, counts, equal audio); the times are figures, never the judgement."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from moss_tts.server import create_app
from moss_tts.server.settings import ServerSettings
from tests.faults.test_server_faults import Trickle, answer_of, body_head, read_to_end, until
from tests.server.helpers import Served, call, settings

ATTACKS = ("stall", "bomb", "flood", "reask", "fields", "backend")
SAFETY_S = 120       # seconds: only a broken server makes an attack wait this long
SHORT = {"model": "tts-1", "input": "Hello there, this is a short request.",
         "response_format": "pcm", "max_new_frames": 4}


@dataclass
class Held:
    """One attack's row of the "bounds held" table, its report line, and what the test reads."""

    attack: str
    bound: str
    figure: str
    ok: bool
    line: str
    seen: dict = field(default_factory=dict)

    def row(self) -> dict:
        return {"attack": self.attack, "bound": self.bound, "figure": self.figure,
                "ok": "yes" if self.ok else "NO"}


def attack_names(text: str) -> tuple[str, ...]:
    """--attacks: a comma list of ATTACKS, `all` or `none`."""
    import argparse

    names = [n.strip() for n in text.split(",") if n.strip()]
    if names in ([], ["none"]):
        return ()
    if names == ["all"]:
        return ATTACKS
    unknown = sorted(set(names) - set(ATTACKS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown attack {unknown[0]!r}; pick from "
                                         f"{', '.join(ATTACKS)}, all or none")
    return tuple(n for n in ATTACKS if n in names)


def add_arguments(ap) -> None:
    ap.add_argument("--attacks", type=attack_names, default=ATTACKS,
                    help=f"comma list of {', '.join(ATTACKS)} (default all; none: no attack)")
    ap.add_argument("--body-timeout", type=float, default=2.0,
                    help="the stall attack's server --body-timeout")
    ap.add_argument("--stalled", type=int, default=4,
                    help="bodies held: half send nothing, half trickle")
    ap.add_argument("--trickle-every", type=float, default=0.5,
                    help="seconds between a trickling body's bytes")
    ap.add_argument("--bomb-samples", type=int, default=96 * 2**20,
                    help="samples of silence in the FLAC bomb (16 kHz; 100 M: ~317 KB)")
    ap.add_argument("--flood-messages", type=int, default=30)
    ap.add_argument("--flood-chars", type=int, default=4000, help="'y' per flood message")
    ap.add_argument("--reasks", type=int, default=200,
                    help="streamed requests asked again at once on an exactly full server")
    ap.add_argument("--backend-clients", type=int, default=2,
                    help="clients asking in a loop while the RPC backend dies and comes back")
    ap.add_argument("--backend-gone", type=float, default=3.0,
                    help="seconds the RPC backend stays dead")


def run_attacks(args, tmp: Path, nano_files, realtime_files) -> list[Held]:
    """The attacks `args.attacks` names, each on its own server: Nano ones over one load of
    `nano_files` (model, codec), the flood over `realtime_files`, the backend one in a
    `serve` child process."""
    from moss_tts.models.nano_tts import NanoTTS
    from moss_tts.models.realtime_tts import RealtimeTTS

    held = []
    voices = tmp / "attack-voices"
    nano = [n for n in args.attacks if n in NANO_ATTACKS]
    if nano:
        with NanoTTS.load(nano_files[0], codec=nano_files[1], threads=args.threads) as tts:
            held += [attempt(name, NANO_ATTACKS[name], args, tts, voices, tmp) for name in nano]
    if "flood" in args.attacks:
        with RealtimeTTS.load(realtime_files[0], codec=realtime_files[1],
                              threads=args.threads) as rt:
            held.append(attempt("flood", flood, args, rt, voices))
    if "backend" in args.attacks:
        held.append(attempt("backend", backend, args, nano_files, tmp))
    return sorted(held, key=lambda h: ATTACKS.index(h.attack))


def attempt(name: str, attack, *args) -> Held:
    """The attack's row; one that failed to run is a row that did not hold, saying why."""
    try:
        return attack(*args)
    except Exception as e:  # noqa: BLE001  (the soak goes on to the next attack)
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return Held(name, "-", f"did not run: {why}", False, f"{name}: did not run: {why}",
                    {"error": e})


def speak(url: str, body: dict, timeout: float = SAFETY_S) -> tuple[float, int, bytes]:
    """(seconds, status, body) of one speech request."""
    t0 = time.perf_counter()
    status, _, raw = call(url, "/v1/audio/speech", body, timeout=timeout)
    return time.perf_counter() - t0, status, raw


def timed_health(url: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    return call(url, "/health", timeout=SAFETY_S)[0], time.perf_counter() - t0


def spread(seconds) -> str:
    lo, hi = f"{min(seconds):.2f}", f"{max(seconds):.2f}"
    return f"{lo} s" if lo == hi else f"{lo}-{hi} s"


# -- 1. a request body that stalls or trickles (issue 31, finding 5) -----------------------------
def held_body(port: int, trickle_every: float | None) -> tuple[float, str]:
    """A speech POST whose headers arrive whole and whose body then stalls (or trickles a byte
    every `trickle_every` s): (seconds it held its connection, the answer: a status, "closed"
    when the server closed it unanswered, "held" when it was still open after SAFETY_S)."""
    t0 = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(body_head(port))
    trickle = Trickle(sock, b" " * 10**6, trickle_every) if trickle_every else None
    try:
        raw = read_to_end(sock)
        answer = str(answer_of(raw)[0]) if raw else "closed"
    except TimeoutError:
        answer = "held"
    finally:
        if trickle:
            trickle.end()
        sock.close()
    return time.perf_counter() - t0, answer


def stall(args, tts, voices, tmp) -> Held:
    server = Served(create_app(tts, settings(voices, body_timeout=args.body_timeout)),
                    ServerSettings(max_connections=args.max_connections))
    kinds = [None if i % 2 == 0 else args.trickle_every for i in range(args.stalled)]
    got = [None] * len(kinds)

    def client(i):
        got[i] = held_body(server.port, kinds[i])
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(kinds))]
    for t in threads:
        t.start()
    time.sleep(min(0.2, args.body_timeout / 4))      # the bodies are being held
    health, health_dt = timed_health(server.url)
    _, speech, _ = speak(server.url, SHORT)
    for t in threads:
        t.join()
    freed = until(lambda: not server.server.server_state.connections, SAFETY_S)
    server.stop()
    stalled = [g for g, k in zip(got, kinds) if k is None]
    trickled = [g for g, k in zip(got, kinds) if k is not None]
    ok = all(a == "408" for _, a in stalled) and all(a in ("408", "closed") for _, a in trickled) \
        and health == 200 and speech == 200 and freed

    def told(group):
        if not group:
            return "none"
        counts = Counter(a for _, a in group)
        return f"held {spread([dt for dt, _ in group])}, " + \
            ", ".join(f"{a} x{n}" for a, n in sorted(counts.items()))
    figure = f"stalled {told(stalled)}; trickling {told(trickled)}"
    line = (f"{len(stalled)} stalled + {len(trickled)} trickling bodies (a byte every "
            f"{args.trickle_every:g} s; --body-timeout {args.body_timeout:g}): {figure}; "
            f"/health meanwhile {health} in {1e3 * health_dt:.1f} ms, speech {speech}; "
            f"{'every connection freed' if freed else 'A CONNECTION STAYED OPEN'}")
    return Held("stall", f"--body-timeout {args.body_timeout:g} s (+1 s per 8 KiB)", figure,
                ok, line, {"answers": [a for _, a in got], "health": health, "speech": speech})


# -- 2. a decompression bomb as reference_audio (issue 31, finding 4) ----------------------------
@contextlib.contextmanager
def peak_rss():
    """`with peak_rss() as growth:` ... `growth()`: the most this process's resident memory
    rose above its start inside the block, in bytes, and how it was measured: VmHWM reset on
    entry (/proc/self/clear_refs 5), else VmRSS sampled every millisecond."""
    def vm(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0
    start, peak, stop = vm("VmRSS"), [0], threading.Event()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        how, sampler = "VmHWM", None
    except OSError:
        how = "VmRSS sampled each ms"

        def sample():
            while not stop.wait(0.001):
                peak[0] = max(peak[0], vm("VmRSS"))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    seen = {}
    try:
        yield lambda: (seen["growth"], how)
    finally:
        stop.set()
        if sampler:
            sampler.join()
        seen["growth"] = max(vm("VmHWM") if how == "VmHWM" else peak[0], start) - start


def bomb(args, tts, voices, tmp) -> Held:
    from moss_tts.audio import REFERENCE_MAX_SECONDS
    from moss_tts.server.request import MAX_UPLOAD_BYTES
    from tests.faults.test_upload_bomb import RATE, b64, flac_of_silence

    flacs = {"honest": flac_of_silence(int(REFERENCE_MAX_SECONDS * RATE)),
             "bomb": flac_of_silence(args.bomb_samples)}
    server = Served(create_app(tts, settings(voices)))
    for _ in range(2):      # warm: the encoder's graphs and buffers (~100 MiB at first)
        speak(server.url, SHORT | {"reference_audio": b64(flacs["honest"])})
    growth, status = {"honest": 0, "bomb": 0}, {"honest": [], "bomb": []}
    for name in ("honest", "bomb") * 2:          # twice each: the most either took
        body = SHORT | {"seed": 1, "reference_audio": b64(flacs[name])}
        with peak_rss() as grew:
            status[name].append(speak(server.url, body)[1])
        growth[name], how = max(growth[name], grew()[0]), grew()[1]
    health, _ = timed_health(server.url)
    server.stop()
    bound = 4 * MAX_UPLOAD_BYTES
    mib = 2**-20
    whole = args.bomb_samples * 4          # the whole decode as float32, as it was made before
    ok = status == {"honest": [200] * 2, "bomb": [200] * 2} and growth["bomb"] <= bound and \
        health == 200
    figure = (f"+{growth['bomb'] * mib:.1f} MiB peak (30 s file: +{growth['honest'] * mib:.1f}; "
              f"whole decode: {whole * mib:.0f} MiB)")
    line = (f"decompression bomb as reference_audio ({len(flacs['bomb']) / 1e3:.0f} KB FLAC, "
            f"{args.bomb_samples / 1e6:.1f} M samples = {args.bomb_samples / RATE:.0f} s at "
            f"{RATE} Hz; a voice uses {REFERENCE_MAX_SECONDS:g} s = "
            f"{REFERENCE_MAX_SECONDS * RATE * 4 * mib:.1f} MiB as float32), twice: "
            f"{status['bomb']}, this process's peak RSS ({how}; the server runs in it) "
            f"{figure}; /health after {health}")
    return Held("bomb", f"peak RSS <= 4 x the {MAX_UPLOAD_BYTES * mib:.0f} MiB upload limit",
                figure, ok, line, {"status": status, "growth": growth, "how": how})


# -- 3. a no-space live flood on the tiny Realtime model (issue 31, finding 3) ------------------
REALTIME = "moss-tts-realtime"
BESIDE = {"model": REALTIME, "input": "A request spoken while a live session floods the model.",
          "seed": 7, "max_new_frames": 200, "response_format": "pcm"}


def flood_session(url: str, messages: int, chars: int, first) -> dict:
    """One live client: `messages` of `chars` 'y', then end; what the server answered (its
    error event's message, the close code) and when, from the first message (after which
    `first()` is called)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from tests.faults.test_live_flood import next_event, send_text, started

    out = {"sent": 0, "message": None, "code": None}
    with connect(url.replace("http://", "ws://") + "/v1/audio/live") as ws:
        started(ws, {"seed": 1})
        t0 = time.perf_counter()
        try:
            for _ in range(messages):
                send_text(ws, "y" * chars)
                out["sent"] += 1
                if out["sent"] == 1:
                    first()
            ws.send(json.dumps({"type": "end"}))
        except ConnectionClosed:        # refused while it still sent: what it waits for
            pass
        try:
            while (event := next_event(ws))["type"] not in ("error", "turn_done"):
                pass
            out["seconds"] = time.perf_counter() - t0
            if event["type"] == "turn_done":     # spoken whole: no bound was met
                return out
            out["message"] = event["message"]
            ws.recv(timeout=SAFETY_S)
        except ConnectionClosed as e:
            out["code"] = e.rcvd.code if e.rcvd else None
        except TimeoutError:
            out["message"] = "no answer"
    return out


def flood(args, rt, voices) -> Held:
    server = Served(create_app({REALTIME: rt}, settings(voices, max_streams=args.max_streams)))
    alone = [speak(server.url, BESIDE) for _ in range(3)]
    done, beside = threading.Event(), []

    def speaker():      # speech requests on the same model for as long as the flood goes on
        while True:
            beside.append(speak(server.url, BESIDE))
            if done.is_set():
                return
    thread = threading.Thread(target=speaker)
    got = flood_session(server.url, args.flood_messages, args.flood_chars, thread.start)
    done.set()
    thread.join()
    server.stop()
    audio = alone[0][2]
    message = got["message"] or ""
    ok = message.startswith("a live turn takes at most") and got["code"] == 1008 and \
        all(s == 200 and raw == audio for _, s, raw in alone + beside)
    statuses = Counter(s if raw == audio else f"{s}, other audio" for _, s, raw in beside)
    alone_s = statistics.median(dt for dt, _, _ in alone)
    beside_s = statistics.median(dt for dt, _, _ in beside)
    bound = message.split(",")[0].removeprefix("a live turn takes at most ") + " a turn" \
        if ok else "a live turn's text"
    took = f"{1e3 * got['seconds']:.0f} ms" if "seconds" in got else "-"
    figure = (f"{'refused' if message else 'NOT refused, ended'} in {took} ({got['sent']} of "
              f"{args.flood_messages} messages sent); "
              f"speech beside {beside_s:.2f} s vs {alone_s:.2f} s alone")
    line = (f"no-space live flood ({args.flood_messages} x {args.flood_chars} 'y', then end) on "
            f"the tiny Realtime model: {message or 'NOT REFUSED'!r} (close {got['code']}) "
            f"{took} after its first message; a speech request on the same model beside it: "
            f"{len(beside)} x, p50 {beside_s:.3f} s (alone {alone_s:.3f} s, "
            f"x{beside_s / alone_s:.1f}), "
            f"{'audio equal to alone' if ok else 'statuses ' + str(dict(statuses))}")
    return Held("flood", bound, figure, ok, line, got | {"beside": len(beside)})


# -- 4. asking again at once on an exactly full server (issue 31, finding 6) -------------------
def reask(args, tts, voices, tmp) -> Held:
    """max_streams places, queue 0, and as many clients, each streaming a request and asking
    again the moment it has the end, over one keep-alive connection."""
    streams = args.max_streams
    server = Served(create_app(tts, settings(voices, queue_depth=0, max_streams=streams)))
    per_client = math.ceil(args.reasks / streams)
    statuses, lat = [], []

    def client(c):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=SAFETY_S)
        body = json.dumps(SHORT | {"max_new_frames": args.frames, "seed": c,
                                   "stream_format": "audio"})
        for _ in range(per_client):
            t0 = time.perf_counter()
            conn.request("POST", "/v1/audio/speech", body,
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            statuses.append(r.status)
            lat.append(time.perf_counter() - t0)
            if r.will_close:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=SAFETY_S)
        conn.close()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.stop()
    busy = statuses.count(503)
    ok = busy == 0 and statuses.count(200) == len(statuses)
    figure = f"{busy} x 503 of {len(statuses)}"
    line = (f"{streams} client(s) asking again at once, streamed, on an exactly full server "
            f"(--max-streams {streams}, --queue 0): {figure}, other non-200: "
            f"{len(statuses) - busy - statuses.count(200)}; latency p50 "
            f"{1e3 * statistics.median(lat):.1f} ms")
    return Held("reask", f"{streams} place(s), freed before the last byte", figure, ok, line,
                {"statuses": Counter(statuses)})


# -- 5. every capped field past its bound (issue 31, finding 7) ---------------------------------
@contextlib.contextmanager
def queued_jobs():
    """`with queued_jobs() as jobs:` ... `len(jobs)`: every job put in a model's line inside
    the block (ModelWorker.submit and open_lane), on every server in this process."""
    from moss_tts.server.worker import ModelWorker

    jobs, submit, open_lane = [], ModelWorker.submit, ModelWorker.open_lane

    def counted(original):
        def call_it(self, *a, **kw):
            jobs.append(original.__name__)
            return original(self, *a, **kw)
        return call_it
    ModelWorker.submit, ModelWorker.open_lane = counted(submit), counted(open_lane)
    try:
        yield jobs
    finally:
        ModelWorker.submit, ModelWorker.open_lane = submit, open_lane


def capped_fields() -> list[tuple[str, str, dict, int]]:
    """(label, the field the answer must name, the request, the status): each capped field
    one past its bound, read from its declaration."""
    from moss_tts.knobs import MAX_PROMPT_CHARS, SEED_LIMIT
    from moss_tts.models.registry import BY_KIND
    from moss_tts.server.request import MAX_INPUT_CHARS

    sfx = BY_KIND["sfx"].tts_class()
    description = "y" * (sfx.MAX_TEXT_CHARS + 1)
    nano = {"input": "Hello.", "response_format": "pcm", "max_new_frames": 4}
    sound = {"model": "sfx", "sound": "Rain.", "response_format": "pcm", "max_new_rows": 8}
    return [
        (f"input {MAX_INPUT_CHARS + 1} chars", "input", nano | {"input": "y" * (
            MAX_INPUT_CHARS + 1)}, 413),
        (f"sfx input {len(description)} chars", "input",
         {"model": "sfx", "input": description, "response_format": "pcm"}, 400),
        (f"instructions {MAX_PROMPT_CHARS + 1} chars", "instructions",
         {"model": "voicegen", "input": "Hello.", "instructions": "y" * (MAX_PROMPT_CHARS + 1),
          "response_format": "pcm"}, 400),
        ("seconds 1e300", "seconds", sound | {"seconds": 1e300}, 400),
        ("tokens 1e23", "tokens", sound | {"tokens": 1e23}, 400),
        (f"seed {SEED_LIMIT}", "seed", nano | {"seed": SEED_LIMIT}, 400),
    ]


def fields(args, tts, voices, tmp) -> Held:
    from fixtures.make_delay import make_tiny_published_models
    from moss_tts.models.registry import family_of_model

    files = make_tiny_published_models(tmp / "fields", ("voicegen", "sfx"))
    models = {kind: family_of_model(files[kind]).tts_class().load(files[kind],
                                                                  codec=files["codec"],
                                                                  threads=args.threads)
              for kind in ("voicegen", "sfx")}
    server = Served(create_app({"moss-tts-nano": tts, **models}, settings(voices)))
    answers = []
    with queued_jobs() as jobs:
        for label, name, body, want in capped_fields():
            status, _, raw = call(server.url, "/v1/audio/speech", body, timeout=SAFETY_S)
            message = json.loads(raw)["error"]["message"] if status >= 400 else ""
            answers.append((label, status, want, f"'{name}'" in message))
        refused_jobs = len(jobs)
        guard = speak(server.url, SHORT)[1]        # within its bounds: queued and served
        guard_jobs = len(jobs) - refused_jobs
    server.stop()
    for model in models.values():
        model.close()
    ok = all(status == want and named for _, status, want, named in answers) and \
        refused_jobs == 0 and guard == 200 and guard_jobs == 1
    figure = ", ".join(f"{label} {status}" for label, status, _, _ in answers) + \
        f"; {refused_jobs} queued"
    line = (f"every capped field one past its bound (tiny Nano, VoiceGenerator, SoundEffect): "
            + ", ".join(f"{label}: {status}{'' if named else ' (FIELD NOT NAMED)'}"
                        for label, status, _, named in answers)
            + f"; jobs queued by them {refused_jobs} (a request within bounds: {guard}, "
              f"{guard_jobs} job)")
    return Held("fields", "each field's declared bound: 400/413, before any work", figure, ok,
                line, {"answers": answers, "queued": refused_jobs})


NANO_ATTACKS = {"stall": stall, "bomb": bomb, "reask": reask, "fields": fields}


# -- 6. a lost RPC backend under load (issue 31, finding 2) ------------------------------------
def health_of(url: str) -> tuple[int, str] | None:
    """(status, its "status" field) of /health, None while nothing answers."""
    try:
        status, _, body = call(url, "/health", timeout=5)
    except OSError:
        return None
    return status, json.loads(body).get("status")


class Load:
    """`clients` threads asking for short speech in a loop (a pause after a refusal, as a
    client honouring Retry-After would, shortened), each answer noted as (start, end,
    status)."""

    def __init__(self, url: str, clients: int, frames: int):
        self.answers, self.stop = [], threading.Event()

        def client(c):
            i = 0
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    status = call(url, "/v1/audio/speech", SHORT | {
                        "max_new_frames": frames, "seed": c * 10**6 + i}, timeout=SAFETY_S)[0]
                except OSError:
                    status = "no answer"
                self.answers.append((t0, time.monotonic(), status))
                i += 1
                if status != 200:
                    self.stop.wait(0.05)
        self.threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in self.threads:
            t.start()

    def end(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def serve_on(nano_files, backend_name: str, args, tmp: Path, log, extra=(),
             launcher=("-m", "moss_tts")):
    """`python -m moss_tts serve` of the (model, codec) files on `backend_name`, with `extra`
    flags, once it answers (bench/serve_bench.py serves any family through it; its
    `launcher` replaces `-m moss_tts` to patch the server process first)."""
    from tests.faults.test_backend_death import free_port, wait_for

    port = free_port()
    cmd = [sys.executable, *launcher, "serve", "--model", str(nano_files[0]), "--codec",
           str(nano_files[1]), "--backend", backend_name, "--port", str(port), "--max-streams",
           str(args.max_streams), *extra] + (["--threads", str(args.threads)] if args.threads
                                             else [])
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            env={**os.environ, "MOSS_TTS_VOICES": str(tmp / "rpc-voices")})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: health_of(url) or proc.poll() is not None, "serve starting", SAFETY_S)
    except BaseException:
        proc.kill()
        raise
    if proc.poll() is not None:
        log.seek(0)
        raise RuntimeError(f"serve --backend {backend_name} ended: {log.read()[-2000:]!r}")
    return proc, url


def backend(args, nano_files, tmp) -> Held:
    from moss_tts.ggml.rpc import LocalServer
    from tests.faults.test_backend_death import wait_for

    same = SHORT | {"seed": 1, "max_new_frames": 20}
    backends, load, seen = [LocalServer()], None, {}
    with tempfile.TemporaryFile("w+") as log:
        proc, url = serve_on(nano_files, backends[0].name, args, tmp, log)
        try:
            seen["before"] = speak(url, same)
            load = Load(url, args.backend_clients, args.frames)
            wait_for(lambda: [a for a in load.answers if a[2] == 200][args.backend_clients:],
                     "the load answered", SAFETY_S)
            seen["kill"] = time.monotonic()
            backends[0].close()                  # SIGKILL: a lost machine
            seen["health"] = []
            while time.monotonic() < seen["kill"] + args.backend_gone:
                seen["health"].append(health_of(url))
                time.sleep(0.1)
            backends.append(LocalServer(endpoint=backends[0].endpoint))
            seen["back"] = time.monotonic()
            with contextlib.suppress(AssertionError):     # never back: the row says so
                seen["answered"] = wait_for(lambda: sorted(
                    end for start, end, s in load.answers if s == 200 and start > seen["kill"]),
                    "the model answering again", SAFETY_S)[0]
            load.end()
            seen["alive"] = proc.poll() is None
            seen["after"] = speak(url, same) if seen["alive"] else (0, "no server", b"")
        finally:
            if load is not None:
                load.end()
            proc.terminate()
            proc.wait(SAFETY_S)
            for b in backends:
                b.close()
    return backend_held(args, seen, load.answers)


def backend_held(args, seen: dict, answers: list) -> Held:
    """The backend attack's row from what it saw."""
    gone = Counter(s for start, _, s in answers if seen["kill"] < start < seen["back"])
    health = Counter(f"{h[0]} {h[1]}" if h else "no answer" for h in seen["health"])
    equal = seen["before"][2] == seen["after"][2]
    ok = seen["alive"] and seen["before"][1] == seen["after"][1] == 200 and equal and \
        "answered" in seen and \
        set(gone) == {503} and "503 unavailable" in health and \
        set(health) <= {"503 unavailable", "200 ok"}
    back = f"{seen['answered'] - seen['back']:.1f} s" if "answered" in seen else \
        f"NOT within {SAFETY_S} s"
    figure = (f"{gone[503]} x 503 while gone; /health {health.most_common(1)[0][0]}; "
              f"answering {back} after it was back; audio {'equal' if equal else 'DIFFERS'}")
    line = (f"RPC backend killed under load ({args.backend_clients} clients; serve --backend "
            f"rpc://, the model in a child process), dead {args.backend_gone:g} s: requests "
            f"made while it was gone got {dict(gone)}; /health meanwhile {dict(health)}; the "
            f"server {'stayed up' if seen['alive'] else 'DIED'}; the model answered again "
            f"{back} after the backend came back; the same request's audio after "
            f"{'equals' if equal else 'DIFFERS FROM'} the audio before")
    return Held("backend", "a lost backend ends only its requests: 503, then back", figure, ok,
                line, {"gone": gone, "health": health, "alive": seen["alive"], "equal": equal})
