"""Local batch workers: N spawned processes, each loading its models once and running one line
at a time; the driver hands out lines, replaces a worker that dies and re-runs its line.

Ctrl-C reaches the whole process group; workers ignore it and the driver stops them, so only
the driver decides what is written (nothing half-written: fileio.atomic_output).
"""

from __future__ import annotations

import multiprocessing
import signal
from multiprocessing.connection import wait

from .work import LineRunner

STOP_TIMEOUT = 10.0  # seconds a worker gets to free its models after the last line


def _worker_main(conn, threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver handles Ctrl-C and stops us
    runner = LineRunner(threads)
    try:
        while (task := conn.recv()) is not None:
            conn.send(runner.run(task))
    except EOFError:        # the driver is gone
        pass
    finally:
        runner.close()


class _Worker:
    def __init__(self, ctx, threads: int):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, threads), daemon=True)
        self.process.start()
        child.close()
        self.task = None

    def send(self, task: dict) -> None:
        self.task = task
        try:
            self.conn.send(task)
        except OSError:     # it died while idle: its sentinel fires and _collect re-runs the task
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


def run_local(job, workers: int, threads: int) -> None:
    """Run `job`'s pending tasks on `workers` processes of `threads` ggml threads each."""
    ctx = multiprocessing.get_context("spawn")   # fork would copy the driver's threads and locks
    pool = [_Worker(ctx, threads) for _ in range(workers)]
    graceful = False
    try:
        while True:
            for w in pool:
                if w.task is None and (tasks := job.take()):
                    w.send(tasks[0])
            busy = [w for w in pool if w.task is not None]
            if not busy:
                break
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
            for i, w in enumerate(pool):
                if w.task is None or not (w.conn in ready or w.process.sentinel in ready):
                    continue
                pool[i] = _collect(job, w, ctx, threads)
        graceful = True
    finally:
        for w in pool:
            w.stop(graceful)


def _collect(job, w: _Worker, ctx, threads: int) -> _Worker:
    """Take a ready worker's outcome; a dead worker's line is retried on a fresh worker."""
    try:
        if w.conn.poll():
            outcome = w.conn.recv()
            task, w.task = w.task, None
            job.finish(task, outcome)
            return w
    except (EOFError, OSError):
        pass
    w.process.join()
    task, w.task = w.task, None
    job.lost(task, f"worker process died (exit code {w.process.exitcode})")
    job.summary.replaced_workers += 1
    w.stop(False)
    return _Worker(ctx, threads)
