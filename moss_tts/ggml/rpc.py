"""ggml's RPC backend (ggml-rpc.h): a backend whose tensors live in a server process, named
`rpc://HOST:PORT`. A local server running this machine's CPU backend is the CPU-only test of the
device path (issue 26): its memory is not this process's, as a GPU's is not. Needs a build with
MOSS_TTS_GGML_RPC=1. `python -m moss_tts.ggml.rpc HOST:PORT` serves the CPU until killed."""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import BackendError
from . import lib as _lib

SCHEME = "rpc://"
BUILD_HINT = "rebuild ggml with MOSS_TTS_GGML_RPC=1 (`MOSS_TTS_GGML_RPC=1 python -m ggml_build`)"
_CPU_DEVICE = 0         # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_CPU
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_added: set[str] = set()  # endpoints ggml already holds a connection to


def is_rpc_name(name: str) -> bool:
    return name.strip().lower().startswith(SCHEME)


def endpoint_of(name: str) -> str:
    """`rpc://HOST:PORT` → `HOST:PORT` (checked: ggml aborts the process on a malformed one)."""
    rest = name.strip()[len(SCHEME):]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BackendError(f"backend {name!r}: expected {SCHEME}HOST:PORT, e.g. {SCHEME}127.0.0.1:50052")
    return f"{host}:{int(port)}"


def _require_rpc(lib: _lib.Lib, name: str) -> None:
    if "rpc" not in lib.backends:
        raise BackendError(f"backend {name!r}: this ggml build has no RPC backend (built: "
                           f"{', '.join(sorted(lib.backends))}) — {BUILD_HINT}")


def check_name(name: str) -> None:
    """A well-formed `rpc://HOST:PORT` of a build with RPC, where a server listens."""
    _require_rpc(_lib.get(), name)
    endpoint = endpoint_of(name)
    if endpoint not in _added:
        _check_reachable(endpoint)


def device(name: str):
    """The ggml device of the RPC server `name` (its first device)."""
    L = _lib.get()
    _require_rpc(L, name)
    endpoint = endpoint_of(name)
    if endpoint not in _added:
        _check_reachable(endpoint)  # ggml aborts the whole process when it cannot connect
    reg = L.ggml_backend_rpc_add_server(endpoint.encode())
    if not reg or L.ggml_backend_reg_dev_count(reg) == 0:
        raise BackendError(f"RPC server {endpoint} offers no device")
    _added.add(endpoint)
    return L.ggml_backend_reg_dev_get(reg, 0)


def _check_reachable(endpoint: str) -> None:
    host, _, port = endpoint.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise BackendError(f"no RPC server answers at {endpoint} ({e.strerror or e}) — start "
                           f"one with `python -m moss_tts.ggml.rpc {endpoint}`") from None


def serve(endpoint: str, threads: int = 1) -> None:
    """Serve this machine's CPU backend at `endpoint` (HOST:PORT); returns only on failure."""
    L = _lib.get()
    _require_rpc(L, SCHEME + endpoint)
    endpoint = endpoint_of(SCHEME + endpoint)
    cpu = L.ggml_backend_dev_by_type(_CPU_DEVICE)
    devices = (ctypes.c_void_p * 1)(cpu)
    L.ggml_backend_rpc_start_server(endpoint.encode(), None, threads, 1, devices)
    raise BackendError(f"the RPC server at {endpoint} stopped (could it bind the port?)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """An RPC server in a child process on a free local port; `name` is its backend name.

    `close()` (or the with-block's end) kills it. Close every backend, model and buffer on it
    first: ggml aborts the process when a buffer it frees cannot reach its server.
    """

    def __init__(self, threads: int = 1, *, start_timeout: float = 60.0,
                 endpoint: str | None = None):
        self.endpoint = endpoint or f"127.0.0.1:{_free_port()}"   # a given one: a restart
        self.name = SCHEME + self.endpoint
        self._log = tempfile.TemporaryFile()
        env = dict(os.environ)
        # the child loads this package and the same libraries as this process
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
        env[_lib.LIB_DIR_ENV] = str(_lib.get().lib_dir)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moss_tts.ggml.rpc", self.endpoint, "--threads", str(threads),
             "--with-parent"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        host, _, port = self.endpoint.rpartition(":")
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise BackendError(f"the RPC server for {self.endpoint} exited with "
                                   f"{self._proc.returncode}: {self.output()[-500:]!r}")
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise BackendError(f"the RPC server for {self.endpoint} did not listen within "
                                       f"{timeout:.0f}s: {self.output()[-500:]!r}") from None
                time.sleep(0.05)

    def output(self) -> str:
        """What the server printed so far."""
        if self._log.closed:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._log.close()

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moss_tts.ggml.rpc",
                                     description="Serve this machine's CPU backend over ggml RPC.")
    parser.add_argument("endpoint", help="HOST:PORT to listen on, e.g. 127.0.0.1:50052")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the served backend")
    # LocalServer's: the server ends with the process that started it (lifetime.py)
    parser.add_argument("--with-parent", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.with_parent:
        from ..lifetime import end_with_parent
        end_with_parent()
    try:
        serve(args.endpoint, args.threads)
    except BackendError as e:
        print(f"moss_tts.ggml.rpc: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
