"""Local batch workers: N spawned processes, each loading its models once and running one line
at a time, or up to `streams` lines together in one batched model (LineRunner.run_many); the
driver hands out lines, replaces a worker that dies and re-runs its lines.

Ctrl-C reaches the whole process group; workers ignore it and the driver stops them, so only
the driver decides what is written (nothing half-written: fileio.atomic_output). A worker
whose driver is gone (killed, even with SIGKILL) ends at once, mid-line too
(lifetime.end_with_parent).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import wait

from ..ggml.log import abort_cause, on_abort
from ..lifetime import end_with_parent
from .work import LineRunner

STOP_TIMEOUT = 10.0  # seconds a worker gets to free its models after the last line


def _worker_main(conn, threads: int, streams: int, backend: str) -> None:
    end_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver handles Ctrl-C and stops us
    on_abort(lambda message: _lost(conn, message))
    runner = LineRunner(threads, backend)
    try:
        while (tasks := conn.recv()) is not None:
            conn.send(runner.run_many(tasks, streams))
    except (EOFError, BrokenPipeError):     # the driver is gone
        pass
    finally:
        runner.close()


def _lost(conn, message: str) -> None:
    """ggml is ending this worker (its backend lost mid-line: ggml/log.py): the driver hears
    why, in place of the outcomes it waits for."""
    try:
        conn.send(LostBackend(message))
    finally:
        os._exit(1)


@dataclass(frozen=True)
class LostBackend:
    """What a worker sends instead of its outcomes when ggml ends it."""

    message: str


class _Worker:
    def __init__(self, ctx, threads: int, streams: int, backend: str):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, threads, streams, backend),
                                   daemon=True)
        self.process.start()
        child.close()
        self.tasks = None

    def send(self, tasks: list[dict]) -> None:
        self.tasks = tasks
        try:
            self.conn.send(tasks)
        except OSError:     # it died while idle: its sentinel fires and _collect re-runs them
            pass

    def stop(self, graceful: bool) -> None:
        if graceful and self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(STOP_TIMEOUT)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def run_local(job, workers: int, threads: int, streams: int = 1, backend: str = "cpu") -> None:
    """Run `job`'s pending tasks on `workers` processes of `threads` ggml threads each, each
    taking up to `streams` lines at a time, each opening the backend named `backend`."""
    ctx = multiprocessing.get_context("spawn")   # fork would copy the driver's threads and locks
    pool = [_Worker(ctx, threads, streams, backend) for _ in range(workers)]
    graceful = False
    try:
        while True:
            for w in pool:
                if w.tasks is None and (tasks := job.take(streams)):
                    w.send(tasks)
            busy = [w for w in pool if w.tasks is not None]
            if not busy:
                break
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
            for i, w in enumerate(pool):
                if w.tasks is None or not (w.conn in ready or w.process.sentinel in ready):
                    continue
                pool[i] = _collect(job, w, ctx, threads, streams, backend)
        graceful = True
    finally:
        for w in pool:
            w.stop(graceful)


def _collect(job, w: _Worker, ctx, threads: int, streams: int, backend: str) -> _Worker:
    """Take a ready worker's outcomes; a dead worker's lines are retried on a fresh worker."""
    why = None
    try:
        if w.conn.poll():
            outcomes = w.conn.recv()
            if not isinstance(outcomes, LostBackend):
                tasks, w.tasks = w.tasks, None
                for task, outcome in zip(tasks, outcomes, strict=True):
                    job.finish(task, outcome)
                return w
            why = f"{abort_cause(outcomes.message)} on {backend}; its worker ended"
    except (EOFError, OSError):
        pass
    w.process.join()
    tasks, w.tasks = w.tasks, None
    for task in tasks:
        job.lost(task, why or f"worker process died (exit code {w.process.exitcode})")
    job.summary.replaced_workers += 1
    w.stop(False)
    return _Worker(ctx, threads, streams, backend)
