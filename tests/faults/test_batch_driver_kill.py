"""issue 31 (finding 8): a `batch` driver killed while its workers are inside a line leaves none
of them running (design §6: child processes end with their parent), and SIGTERM stops a run as
Ctrl-C does: the workers stopped, one line, a non-zero status, nothing half-written.

The driver runs on the tiny Nano that never stops (stop bias −50); its long lines hold thousands
of sentences, each chunk at its frame budget: an hour of work here, so a worker that noticed its
driver's death only when its line ended outlives every safety limit below. The limit is a
safety net, not the claim: the claim is that the workers end."""

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.batch.conftest import (batch_cli, batch_models, no_partials, outputs,  # noqa: F401
                                  own_cache, records, speech_rows, write_jsonl)   # (fixtures)
from tests.batch.test_command import wait_for_records

LONG_TEXT = " ".join(f"Sentence number {i} is here." for i in range(20_000))
SAFETY_S = 120      # ample for a process to end; a worker that waits for its line takes hours


def proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its third field on (state, ppid, ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid: int, *, depth: int = 1) -> dict[int, str]:
    """{pid: start time} of `pid`'s children (depth 1) or all its descendants (the start time
    tells a pid the kernel gave to another process later apart)."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))):
            parent_of[int(entry.name)] = (int(stat[1]), stat[19])
    found, level = {}, {pid}
    for _ in range(depth):
        level = {p for p, (ppid, _) in parent_of.items() if ppid in level}
        found.update({p: parent_of[p][1] for p in level})
    return found


def command(pid: int) -> str:
    """Its command line, or "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def running(procs: dict[int, str]) -> list[int]:
    """Those of `procs` still running (a zombie has ended: only its parent's wait is left)."""
    return [p for p, start in procs.items()
            if (stat := proc_stat(p)) and stat[19] == start and stat[0] not in "ZX"]


def wait_until_ended(procs: dict[int, str], timeout: float = SAFETY_S) -> list[int]:
    """Those of `procs` still running after `timeout` (none, once they all end)."""
    deadline = time.monotonic() + timeout
    while (left := running(procs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@contextlib.contextmanager
def cleaned_up(driver, procs: dict[int, str]):
    """Whatever the test found, no process of it outlives the test (a worker left running would
    spend an hour of this machine's CPU)."""
    try:
        yield
    finally:
        for pid in running(procs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            driver.kill()
        driver.wait()


def start_mid_line(batch_models, tmp_path):
    """A driver with two workers, each given a line: worker 1 the long line 0 and worker 2 the
    short lines 1 and 2 (recorded, so there is something not to damage) then the long line 3.
    Returns (driver, its children, output directory) once lines 1 and 2 are recorded: worker 1
    is then inside line 0, which it was sent before any line began."""
    rows = speech_rows(4)
    for i in (0, 3):
        rows[i].update(text=LONG_TEXT, max_frames=1550)
    out = tmp_path / "out"
    driver = batch_cli(write_jsonl(tmp_path / "m.jsonl", rows), out, batch_models,
                       "--workers", 2, "--threads", 1, "--quiet", popen=True)
    try:
        wait_for_records(out, 2, driver)
    except BaseException:
        driver.kill()
        raise
    return driver, descendants(driver.pid), out


def test_sigkill_of_the_driver_ends_its_workers_mid_line(batch_models, tmp_path):
    """Before: the worker went on to the end of its line, then died of a broken pipe with a
    traceback."""
    driver, children, out = start_mid_line(batch_models, tmp_path)
    with cleaned_up(driver, children):
        assert len(children) >= 2              # the workers (and multiprocessing's tracker)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=SAFETY_S)
        assert wait_until_ended(children) == []
        assert driver.stderr.read() == b""     # no worker's broken-pipe traceback either


def test_sigterm_stops_the_run_as_ctrl_c_does(batch_models, tmp_path):
    """Before: SIGTERM's default action ended the driver alone (status -15, no line) and the
    workers ran on to the end of their lines."""
    driver, children, out = start_mid_line(batch_models, tmp_path)
    with cleaned_up(driver, children):
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=SAFETY_S)
        assert wait_until_ended(children) == []
        assert driver.returncode == 128 + signal.SIGTERM
        assert driver.stderr.read().decode().splitlines() == ["terminated"]
    # nothing half-written: the two lines made before, whole; no temporary file left
    made = records(out)
    assert [r["id"] for r in made] == ["line001", "line002"] and no_partials(out)
    assert sorted(p.name for p in out.iterdir()) == ["line001.wav", "line002.wav",
                                                     "results.jsonl"]
    assert len(outputs(out)) == 2                                  # each file reads whole
    assert all(json.loads(t) for t in (out / "results.jsonl").read_text().splitlines())


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_drivers_ray_actors_end_mid_line(batch_models, tmp_path, sig):
    """`--ray local`: the driver starts the cluster; its actors belong to the driver's job, and
    Ray ends them with it (SIGKILL: the cluster's processes share the driver's fate, as they
    did before; SIGTERM: ray.shutdown, as after Ctrl-C). Before, ray.init's own SIGTERM
    handler took over: exit status 1 and Ray's C++ "*** SIGTERM received" dump on stderr."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[batch]\")")
    rows = [{"id": "long", "text": LONG_TEXT, "max_frames": 1550}]
    driver = batch_cli(write_jsonl(tmp_path / "m.jsonl", rows), tmp_path / "out", batch_models,
                       "--ray", "local", "--workers", 1, "--threads", 1, "--quiet", popen=True,
                       env={"RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path)})
    seen: dict[int, str] = {}
    with cleaned_up(driver, seen):
        deadline = time.monotonic() + SAFETY_S
        while not (actors := {p: s for p, s in descendants(driver.pid, depth=3).items()
                              if command(p).startswith("ray::LineActor.run_chunk")}):
            seen.update(descendants(driver.pid, depth=3))
            assert driver.poll() is None and time.monotonic() < deadline, driver.returncode
            time.sleep(0.1)
        seen.update(descendants(driver.pid, depth=3))
        driver.send_signal(sig)
        driver.wait(timeout=SAFETY_S)
        assert wait_until_ended(actors) == []
        if sig == signal.SIGTERM:
            assert driver.returncode == 128 + signal.SIGTERM
            assert driver.stderr.read().decode().splitlines() == ["terminated"]
