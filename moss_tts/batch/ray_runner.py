"""Batch lines on Ray actors: one model set per actor, lines sent in chunks, each line's
outcome (audio bytes included) streamed back to the driver, which owns the output directory.

An actor that dies is replaced and the lines of its chunk that had not come back are handed
out again; the driver records each line once, so none is written twice. Every node needs
moss-tts installed (its ggml is built for that machine) and the model, voice and reference
files at the same paths as the driver.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path

from ..errors import InputError
from .work import LineFeed, LineRunner

NAMESPACE = "moss-tts-batch"   # actors are named "worker-<n>" here (a test kills one by name)
# seconds a cluster address gets to accept a connection: Ray itself retries a dead address
# for minutes, printing only its own lines
CONNECT_TIMEOUT_S = 30.0
# the HTTP/2 client preface and an empty SETTINGS frame: what a gRPC client sends first
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


class LineActor:
    """The body of a Ray actor: a LineRunner kept alive between chunks, on the backend named
    `backend` as the actor's node has it, and its lines fed `streams` at a time."""

    def __init__(self, threads: int, streams: int = 1, backend: str = "cpu"):
        self.runner = LineRunner(threads, backend)
        self.feed = LineFeed(self.runner, streams)

    def run_chunk(self, tasks: list[dict]):
        """Yield each line's outcome as it is made (a Ray streaming generator), in the order
        the lines end: one at a time, or up to `streams` decoded together, the chunk's next
        line joining as soon as one ends."""
        # a loop, not `yield from`: what Ray send()s is for this generator, not the feed's
        for outcome in self.feed.run(tasks):
            yield outcome


def _connect(ray, address: str) -> None:
    import moss_tts

    # actors import the moss_tts the driver runs (a checkout, or the same install path)
    code = str(Path(moss_tts.__file__).resolve().parent.parent)
    options = {"namespace": NAMESPACE, "log_to_driver": False, "logging_level": logging.WARNING,
               "runtime_env": {"env_vars": {"PYTHONPATH": code}}}
    if address == "local":      # a private one-machine cluster for this run, on loopback
        options.update(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
    else:
        options["address"] = address
    main_thread = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        ray.init(**options)
    except (ConnectionError, ValueError) as e:   # no cluster there / not an address
        raise InputError(f"--ray {address}: no Ray cluster there ({str(e).splitlines()[0]}); "
                         "start one with `ray start --head`, or pass --ray local") from None
    finally:
        # ray.init makes SIGTERM sys.exit(15) (ray/_private/worker.py, `sigterm_handler`): the
        # caller's handling stands (the CLI's stops the run as Ctrl-C does)
        if main_thread and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


def check_address(address: str) -> None:
    """A host:port where no gRPC server (Ray's GCS, or its client server for ray://) answers
    within CONNECT_TIMEOUT_S is one error, before any work ("auto", "local" and other forms
    are Ray's to find, but "auto" means RAY_ADDRESS when that is set)."""
    target = (os.environ.get("RAY_ADDRESS") or address) if address == "auto" else address
    where = address if target == address else f"{address} (RAY_ADDRESS={target})"
    host, sep, port = target.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)),
                                      timeout=CONNECT_TIMEOUT_S) as s:
            s.sendall(HTTP2_PREFACE)
            frame = s.recv(9)
        # an HTTP/2 server's first frame is its SETTINGS (RFC 9113 §3.4)
        why = None if len(frame) == 9 and frame[3] == 0x4 else "not a gRPC server"
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
    if why:
        raise InputError(f"--ray {where}: no Ray cluster answers there ({why}); start one "
                         "with `ray start --head`, or pass --ray local")


def run_ray(job, address: str, *, workers: int | None, threads: int, chunk: int,
            streams: int = 1, backend: str = "cpu") -> None:
    if address == "local":
        # Ray's default for a new cluster, stated, so it does not warn on every run that it took
        # the default (ray/_private/authentication/authentication_token_setup.py); Ray reads it
        # when imported. A user's own RAY_AUTH_MODE wins.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    try:
        import ray
    except ImportError:
        raise InputError('--ray needs Ray: pip install -e ".[batch]"') from None
    _connect(ray, address)
    try:
        # a chunk holds at least `streams` lines, so an actor's places are all taken
        _run(ray, job, workers, threads, -(-chunk // streams) * streams, streams, backend)
    finally:
        ray.shutdown()   # the actors belong to this driver's job and go with it


def _run(ray, job, workers: int | None, threads: int, chunk: int, streams: int,
         backend: str) -> None:
    actor_class = ray.remote(num_cpus=threads, max_restarts=0)(LineActor)
    count = workers or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    made = 0

    def new_actor():
        nonlocal made
        made += 1
        return actor_class.options(name=f"worker-{made}").remote(threads, streams, backend)

    actors = [new_actor() for _ in range(min(count, len(job.pending)))]
    running = {}               # outcome stream → (actor index, its lines not yet back, by id)
    idle = list(range(len(actors)))
    while True:
        while idle and (tasks := job.take(chunk)):
            i = idle.pop()
            stream = actors[i].run_chunk.options(num_returns="streaming").remote(tasks)
            running[stream] = (i, {task["id"]: task for task in tasks})
        if not running:
            return
        (stream,), _ = ray.wait(list(running), num_returns=1)
        i, tasks = running[stream]
        try:
            outcome = ray.get(next(stream))
        except StopIteration:          # the chunk is done
            del running[stream]
            idle.append(i)
        except ray.exceptions.RayError as e:     # the rest of the chunk is lost: re-run it
            del running[stream]
            for task in tasks.values():
                job.lost(task, f"Ray lost the line ({type(e).__name__})")
            if isinstance(e, ray.exceptions.RayActorError):
                job.summary.replaced_workers += 1
                actors[i] = new_actor()
            idle.append(i)
        else:
            job.finish(tasks.pop(outcome["id"]), outcome)
