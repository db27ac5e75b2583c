"""moss_tts/lifetime.py (issue 31, finding 8): a child that calls end_with_parent ends when its
parent is killed, even while its main thread never yields (a multiprocessing child: the batch
tests in tests/faults/); SIGTERM inside terminate_as_interrupt is a KeyboardInterrupt."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moss_tts.lifetime import Terminated, terminate_as_interrupt

SAFETY_S = 60   # a safety net: the child ends within POLL_S of its parent
ROOT = Path(__file__).resolve().parent.parent

# the parent starts the child, says its pid, and sleeps; the child spins in Python, holding
# the GIL between the interpreter's switches
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(3600)
"""
CHILD = """
from moss_tts.lifetime import end_with_parent
end_with_parent()
print("watching", flush=True)
while True:
    pass
"""


def test_a_child_that_is_not_a_multiprocessing_one_ends_with_its_killed_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE,
                              start_new_session=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})   # this checkout
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline() == b"watching\n"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + SAFETY_S
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child)
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)
        parent.stdout.close()


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_sigterm_in_the_block_is_a_keyboard_interrupt_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as e, terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(SAFETY_S)        # the handler raises at the next bytecode
    assert isinstance(e.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_that_a_library_turned_into_a_plain_keyboard_interrupt_stays_sigterm():
    """Ray's waits raise a plain KeyboardInterrupt for whatever a signal handler raised."""
    with pytest.raises(Terminated), terminate_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(SAFETY_S)
        except Terminated:
            raise KeyboardInterrupt from None
    with pytest.raises(KeyboardInterrupt) as e, terminate_as_interrupt():
        raise KeyboardInterrupt         # Ctrl-C stays Ctrl-C
    assert not isinstance(e.value, Terminated)
