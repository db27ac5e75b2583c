"""Batch lines on Ray actors: one model set per actor, lines sent in chunks, each line's
outcome (audio bytes included) streamed back to the driver, which owns the output directory.

An actor that dies is replaced and the lines of its chunk that had not come back are handed
out again; the driver records each line once, so none is written twice. Every node needs
moss-tts installed (its ggml is built for that machine) and the model, voice and reference
files at the same paths as the driver.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path

from ..errors import InputError
from .work import LineRunner

NAMESPACE = "moss-tts-batch"   # actors are named "worker-<n>" here (a test kills one by name)


class LineActor:
    """The body of a Ray actor: a LineRunner kept alive between chunks."""

    def __init__(self, threads: int):
        self.runner = LineRunner(threads)

    def run_chunk(self, tasks: list[dict]):
        """Yield each line's outcome as it is made (a Ray streaming generator)."""
        for task in tasks:
            yield self.runner.run(task)


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
    try:
        ray.init(**options)
    except (ConnectionError, ValueError) as e:   # no cluster there / not an address
        raise InputError(f"--ray {address}: no Ray cluster there ({str(e).splitlines()[0]}); "
                         "start one with `ray start --head`, or pass --ray local") from None


def run_ray(job, address: str, *, workers: int | None, threads: int, chunk: int) -> None:
    try:
        import ray
    except ImportError:
        raise InputError('--ray needs Ray: pip install -e ".[batch]"') from None
    _connect(ray, address)
    try:
        _run(ray, job, workers, threads, chunk)
    finally:
        ray.shutdown()   # the actors belong to this driver's job and go with it


def _run(ray, job, workers: int | None, threads: int, chunk: int) -> None:
    actor_class = ray.remote(num_cpus=threads, max_restarts=0)(LineActor)
    count = workers or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    made = 0

    def new_actor():
        nonlocal made
        made += 1
        return actor_class.options(name=f"worker-{made}").remote(threads)

    actors = [new_actor() for _ in range(min(count, len(job.pending)))]
    running = {}                       # outcome stream → (actor index, its lines not yet back)
    idle = list(range(len(actors)))
    while True:
        while idle and (tasks := job.take(chunk)):
            i = idle.pop()
            stream = actors[i].run_chunk.options(num_returns="streaming").remote(tasks)
            running[stream] = (i, deque(tasks))
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
            for task in tasks:
                job.lost(task, f"Ray lost the line ({type(e).__name__})")
            if isinstance(e, ray.exceptions.RayActorError):
                job.summary.replaced_workers += 1
                actors[i] = new_actor()
            idle.append(i)
        else:
            job.finish(tasks.popleft(), outcome)
