"""Local batch workers: N spawned processes, each loading its models once and keeping up to
`streams` lines in flight (work.LineFeed: one line at a time, or lines decoded together in one
running batch, the next joining as soon as one ends); the driver hands a worker a line whenever
it has a free place, replaces a worker that dies and re-runs its lines.

Ctrl-C reaches the whole process group; workers ignore it and the driver stops them, so only
the driver decides what is written (nothing half-written: fileio.atomic_output). A worker
whose driver is gone (killed, even with SIGKILL) ends at once, mid-line too
(lifetime.end_with_parent).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
from dataclasses import dataclass
from multiprocessing.connection import wait

from ..ggml.log import abort_cause, on_abort
from ..lifetime import end_with_parent
from .work import LineFeed, LineRunner

STOP_TIMEOUT = 10.0  # seconds a worker gets to free its models after the last line


def _worker_main(conn, threads: int, streams: int, backend: str) -> None:
    end_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver handles Ctrl-C and stops us
    on_abort(lambda message: _lost(conn, message))
    runner = LineRunner(threads, backend)
    feed = LineFeed(runner, streams)
    inbox = _inbox(conn)
    try:
        while True:
            # new lines join between two pulls; with none in flight, wait for them
            for tasks in _arrived(inbox, wait=not feed.flying):
                if tasks is None:       # the driver stops us, or is gone
                    return
                for task in tasks:
                    feed.add(task)
            for outcome in feed.advance():
                conn.send(outcome)
    except (EOFError, BrokenPipeError):     # the driver is gone
        pass
    finally:
        feed.close()
        runner.close()


def _inbox(conn) -> queue.SimpleQueue:
    """The driver's messages as they come, read on a thread of their own: the worker decodes
    between them, and never waits to send an outcome while the driver waits to send it lines
    (the pipe full both ways). None at the end."""
    inbox = queue.SimpleQueue()

    def read() -> None:
        try:
            while (tasks := conn.recv()) is not None:
                inbox.put(tasks)
        except (EOFError, OSError):
            pass
        inbox.put(None)

    threading.Thread(target=read, name="moss-tts-batch-inbox", daemon=True).start()
    return inbox


def _arrived(inbox: queue.SimpleQueue, *, wait: bool):
    """The messages waiting in `inbox` (at least one when `wait`)."""
    if wait:
        yield inbox.get()
    while True:
        try:
            yield inbox.get_nowait()
        except queue.Empty:
            return


def _lost(conn, message: str) -> None:
    """ggml is ending this worker (its backend lost mid-line: ggml/log.py): the driver hears
    why, in place of the outcomes it waits for."""
    try:
        conn.send(LostBackend(message))
    finally:
        os._exit(1)


@dataclass(frozen=True)
class LostBackend:
    """What a worker sends instead of its next outcome when ggml ends it."""

    message: str


class _Worker:
    def __init__(self, ctx, threads: int, streams: int, backend: str):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, threads, streams, backend),
                                   daemon=True)
        self.process.start()
        child.close()
        self.tasks: dict[str, dict] = {}     # its lines in flight, by id

    def send(self, tasks: list[dict]) -> None:
        self.tasks.update((task["id"], task) for task in tasks)
        try:
            self.conn.send(tasks)
        except OSError:     # it died: its sentinel fires and _collect re-runs them
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
    keeping up to `streams` lines in flight (a line sent as soon as a place frees), each
    opening the backend named `backend`."""
    ctx = multiprocessing.get_context("spawn")   # fork would copy the driver's threads and locks
    pool = [_Worker(ctx, threads, streams, backend) for _ in range(workers)]
    graceful = False
    try:
        while True:
            for w in pool:
                if tasks := job.take(streams - len(w.tasks)):
                    w.send(tasks)
            busy = [w for w in pool if w.tasks]
            if not busy:
                break
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
            for i, w in enumerate(pool):
                if w.tasks and (w.conn in ready or w.process.sentinel in ready):
                    pool[i] = _collect(job, w, ctx, threads, streams, backend)
        graceful = True
    finally:
        for w in pool:
            w.stop(graceful)


def _collect(job, w: _Worker, ctx, threads: int, streams: int, backend: str) -> _Worker:
    """Take a ready worker's next outcome; a dead worker's lines are retried on a fresh
    worker."""
    why = None
    try:
        if w.conn.poll():
            outcome = w.conn.recv()
            if not isinstance(outcome, LostBackend):
                job.finish(w.tasks.pop(outcome["id"]), outcome)
                return w
            why = f"{abort_cause(outcome.message)} on {backend}; its worker ended"
    except (EOFError, OSError):
        pass
    w.process.join()
    tasks, w.tasks = w.tasks, {}
    for task in tasks.values():
        job.lost(task, why or f"worker process died (exit code {w.process.exitcode})")
    job.summary.replaced_workers += 1
    w.stop(False)
    return _Worker(ctx, threads, streams, backend)
