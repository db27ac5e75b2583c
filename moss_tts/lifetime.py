"""How long this package's processes live (design §6): a child process ends with its parent,
and SIGTERM stops a command the way Ctrl-C does. It imports nothing of the package, so any
layer may use it, ggml/ (below every other package) included; batch workers do."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import wait

PARENT_GONE_EXIT = 1    # a child's exit status when it ended because its parent was gone
POLL_S = 0.25           # how often a child that is not a multiprocessing one looks at its parent


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt: whatever cleans up after Ctrl-C
    (stopping workers, removing partial files) cleans up after `kill` too."""


def end_with_parent() -> None:
    """End this process as soon as its parent is gone, whatever it is doing.

    A daemon thread waits for the parent and calls os._exit: a main thread busy in ggml
    compute reads no pipe and would only notice when it next talks to its parent. The thread
    needs the GIL only for a moment, which ggml's ctypes calls release and Python code hands
    over every switch interval. Call it first thing in the child (a process started on its
    own, like a server a user runs, must not: its parent is the shell)."""
    threading.Thread(target=_exit_when_parent_gone, name="end-with-parent", daemon=True).start()


def _exit_when_parent_gone() -> None:
    parent = multiprocessing.parent_process()
    if parent is not None:
        # a multiprocessing child: its parent holds the other end of this pipe, which the
        # kernel closes when the parent ends, however it ends (SIGKILL included); so does a
        # parent that lets go of its Process object, after which it could not stop us anyway
        wait([parent.sentinel])
    else:
        # any other child is given to init (or a subreaper) when its parent ends
        ppid = os.getppid()
        while os.getppid() == ppid:
            time.sleep(POLL_S)
    os._exit(PARENT_GONE_EXIT)   # no clean-up: the parent that would want the results is gone


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block (in the main thread), SIGTERM raises Terminated, a KeyboardInterrupt."""
    received = []

    def on_sigterm(signum, frame):
        received.append(signum)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except KeyboardInterrupt as e:
        # Ray runs signal handlers from its C++ waits and raises a plain KeyboardInterrupt for
        # whatever they raised (_raylet.pyx, check_status on an Interrupted status)
        if received and not isinstance(e, Terminated):
            raise Terminated() from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
