"""Messages and subprocesses for the ggml build: one error type, one log prefix, streamed output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PREFIX = "[ggml_build]"


class GgmlBuildError(Exception):
    """A build step failed; the message is one line that says what to do."""


def say(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def run_streamed(cmd: list[str], *, log: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run `cmd`, echoing each output line to stderr (prefixed) and appending it to `log`."""
    with open(log, "a", encoding="utf-8", errors="replace") as log_file:
        log_file.write(f"$ {' '.join(cmd)}\n")
        log_file.flush()
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace")
        except OSError as e:
            raise GgmlBuildError(f"{what}: cannot run {cmd[0]} ({e})") from None
        for line in proc.stdout:
            log_file.write(line)
            print(f"{PREFIX} {line.rstrip()}", file=sys.stderr, flush=True)
        code = proc.wait()
    if code != 0:
        raise GgmlBuildError(f"{what} failed (exit code {code}); full log: {log}")


def first_line(cmd: list[str]) -> str | None:
    """First non-empty output line of `cmd` (stdout, else stderr), or None if it cannot run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                             stdin=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    for text in (out.stdout, out.stderr):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return None
