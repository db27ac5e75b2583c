"""Compute backends (cpu / cuda / vulkan / metal / rpc://HOST:PORT by name), threads, and the native handles
that outlive one graph: a backend, a graph allocator, a tensor buffer (style C10)."""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import BackendError, InputError
from . import lib as _lib

logger = logging.getLogger(__name__)

THREADS_ENV = "MOSS_TTS_THREADS"
# enum ggml_backend_dev_type
_DEV_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
# User-facing backend names → ggml registry names.
_REGISTRY_NAMES = {"cpu": "CPU", "cuda": "CUDA", "vulkan": "Vulkan", "metal": "Metal",
                   "blas": "BLAS", "sycl": "SYCL", "opencl": "OpenCL"}
# The build switch of each backend ggml_build has one for (its ENV_FLAGS, docs/build.md; the
# others go through MOSS_TTS_GGML_CMAKE_ARGS): what a user sets to add a backend the build lacks
BUILD_SWITCHES = {"cuda": "MOSS_TTS_GGML_CUDA=1", "vulkan": "MOSS_TTS_GGML_VULKAN=1",
                  "metal": "MOSS_TTS_GGML_METAL=1", "blas": "MOSS_TTS_GGML_BLAS=1"}


class NativeResource:
    """Owner of native handles (style C10): `close()` is idempotent and is also called by a
    with-block's end and by garbage collection; nothing else frees the handles."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass


@contextmanager
def released_on_error(*resources):
    """Close `resources` if the block raises: a load that fails half-way keeps nothing mapped
    or allocated, even while the caller holds the exception (its traceback keeps the frames)."""
    try:
        yield
    except BaseException:
        for r in resources:
            if r is not None:
                r.close()
        raise


def default_threads() -> int:
    """Threads for the CPU backend: `MOSS_TTS_THREADS`, else the cores this process may use.

    ggml's own default (4) oversubscribes a 2-core machine and runs ~11x slower on small graphs.
    """
    env = os.environ.get(THREADS_ENV)
    if env:
        try:
            n = int(env)
        except ValueError:
            raise BackendError(f"{THREADS_ENV}={env!r} is not a whole number of threads") from None
        if n < 1:
            raise BackendError(f"{THREADS_ENV}={env!r} must be at least 1")
        return n
    return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's core count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Device:
    name: str          # ggml device name, e.g. "CPU", "CUDA0"
    registry: str      # ggml registry (backend) name, e.g. "CPU", "CUDA"
    description: str
    kind: str          # cpu | gpu | igpu | accel
    memory_free: int
    memory_total: int


def devices() -> list[Device]:
    """Every device the loaded ggml build registered."""
    L = _lib.get()
    out = []
    for i in range(L.ggml_backend_dev_count()):
        dev = L.ggml_backend_dev_get(i)
        free, total = _lib.c_size_t(0), _lib.c_size_t(0)
        L.ggml_backend_dev_memory(dev, _lib.ctypes.byref(free), _lib.ctypes.byref(total))
        out.append(Device(
            name=L.ggml_backend_dev_name(dev).decode(),
            registry=L.ggml_backend_reg_name(L.ggml_backend_dev_backend_reg(dev)).decode(),
            description=(L.ggml_backend_dev_description(dev) or b"").decode(),
            kind=_DEV_TYPES.get(L.ggml_backend_dev_type(dev), "unknown"),
            memory_free=free.value, memory_total=total.value))
    return out


def devices_missing() -> dict[str, str]:
    """Each backend this build has that registered no device on this machine (`cuda` built
    where no GPU or driver is) → why, in ggml's words where it logged a reason, else "". The
    CPU always has its device, and an RPC server's comes only when one is named."""
    L = _lib.get()
    registered = {d.registry for d in devices()}
    return {name: _no_device_reason(L, _REGISTRY_NAMES[name]) for name in sorted(L.backends)
            if name in _REGISTRY_NAMES and _REGISTRY_NAMES[name] not in registered}


def _no_device_reason(L, registry: str) -> str:
    """What ggml logged while registering `registry`'s backend, without its function name
    ("failed to initialize CUDA: CUDA driver version is insufficient ..."), or ""."""
    said = L.registration_problem or ""
    if registry.lower() not in said.lower():
        return ""
    where, _, text = said.partition(": ")
    return text if text and where.isidentifier() else said


def _find_device(name: str):
    """`cpu`, `cuda`, `cuda1`, `vulkan0`, ..., an exact ggml device name, or `rpc://HOST:PORT`
    (a ggml RPC server, rpc.py) → device handle."""
    from . import rpc   # here, not at the top: `python -m moss_tts.ggml.rpc` runs that module
    if rpc.is_rpc_name(name):
        return rpc.device(name)
    L = _lib.get()
    wanted = name.strip()
    base = wanted.rstrip("0123456789").lower()
    index = int(wanted[len(base):]) if wanted[len(base):] else 0
    registry = _REGISTRY_NAMES.get(base)
    matches = []
    for i in range(L.ggml_backend_dev_count()):
        dev = L.ggml_backend_dev_get(i)
        dev_name = L.ggml_backend_dev_name(dev).decode()
        reg_name = L.ggml_backend_reg_name(L.ggml_backend_dev_backend_reg(dev)).decode()
        if wanted and dev_name.lower() == wanted.lower():
            return dev
        if registry is not None and reg_name == registry:
            matches.append(dev)
    if index < len(matches):
        return matches[index]
    raise BackendError(_not_found(name, base, len(matches), L))


def _not_found(name: str, base: str, found: int, L) -> str:
    """Why `name` names no device, and the fix: the names this build takes, or for a kind
    ggml has and this build lacks, the switch that builds it (docs/build.md)."""
    from .rpc import SCHEME

    built = L.backends
    has = ", ".join(sorted(b for b in built if b != "rpc")
                    + ([f"{SCHEME}HOST:PORT"] if "rpc" in built else []))
    if not name.strip():
        return (f"backend {name!r} is empty: name one this ggml build has ({has}), or leave it "
                "out for the CPU")
    if base.startswith("rpc"):
        return f"backend {name!r}: name an RPC server as {SCHEME}HOST:PORT"
    if base not in _REGISTRY_NAMES:
        return f"backend {name!r} is not a ggml backend: this build has {has}"
    if base not in built:
        switch = BUILD_SWITCHES.get(base, f"MOSS_TTS_GGML_CMAKE_ARGS=-DGGML_{base.upper()}=ON")
        return (f"backend {name!r} is not in this ggml build (it has {has}): rebuild ggml with "
                f"{switch} set (`{switch} python -m ggml_build`; docs/build.md)")
    if not found:
        why = _no_device_reason(L, _REGISTRY_NAMES[base])
        return (f"backend {name!r}: this ggml build has {_REGISTRY_NAMES[base]} but finds no "
                f"{_REGISTRY_NAMES[base]} device on this machine{f' ({why})' if why else ''}: "
                "leave it out for the CPU")
    return (f"backend {name!r}: this machine's {_REGISTRY_NAMES[base]} devices: "
            + ", ".join(f"{base}{i}" for i in range(found)))


def check_name(name: str, *, flag: str | None = None) -> None:
    """Raise the BackendError `Backend(name)` would, without initializing it: for a front end
    that checks a name before any model loads, or hands it on (batch workers). `flag`: how its
    user names the setting (`--backend`): the error is then an InputError naming it. An RPC
    server serves one client at a time, so its name is checked with a bare connection that is
    closed at once."""
    from . import rpc
    try:
        if rpc.is_rpc_name(name):
            rpc.check_name(name)
        else:
            _find_device(name)
    except BackendError as e:
        if flag is None:
            raise
        text = str(e)   # "backend 'x' ...", or a sentence of its own (an RPC server's)
        raise InputError(flag + text[len("backend"):] if text.startswith("backend ")
                         else f"{flag} {name}: {text}") from None


class Backend(NativeResource):
    """One initialized ggml backend. `Backend("cpu", threads=2)`; close() frees it.

    Graph computes on one backend run one at a time: the CPU backend plans every compute into a
    single work buffer it owns, so two threads computing at once (two models sharing the
    backend, a voice upload during a synthesis) corrupt each other's results.
    """

    def __init__(self, name: str = "cpu", threads: int | None = None, *,
                 lacks: frozenset[str] = frozenset()):
        self.lib = _lib.get()
        dev = _find_device(name)
        self._ptr = self.lib.ggml_backend_dev_init(dev, None)
        if not self._ptr:
            raise BackendError(f"ggml could not initialize backend {name!r}")
        self.name = self.lib.ggml_backend_name(self._ptr).decode()
        self.is_cpu = bool(self.lib.ggml_backend_is_cpu(self._ptr))
        self.buffer_type = self.lib.ggml_backend_get_default_buffer_type(self._ptr)
        self.is_host = bool(self.lib.ggml_backend_buft_is_host(self.buffer_type))
        self.alignment = self.lib.ggml_backend_buft_get_alignment(self.buffer_type)
        self.threads = 0
        self._compute_lock = threading.Lock()
        # ggml op names this device is to treat as unsupported (run on the CPU): the test of the
        # scheduler's fallback on a device that has every op
        self.lacks = frozenset(lacks)
        if self.lacks and self.is_cpu:
            self.close()
            raise BackendError("lacks= names ops a device leaves to the CPU; the CPU has them all")
        self.set_threads(threads)

    @property
    def ptr(self):
        if not self._ptr:
            raise BackendError(f"backend {self.name} is closed")
        return self._ptr

    @property
    def compute_lock(self) -> threading.Lock:
        """Held while a graph computes here (the CPU backend plans into one work buffer)."""
        return self._compute_lock

    def set_threads(self, threads: int | None) -> None:
        n = default_threads() if threads is None else int(threads)
        if n < 1:
            raise BackendError(f"threads must be at least 1, got {threads}")
        if self.is_cpu and n > usable_cores():
            # ggml's threads spin while they wait: past the cores they only take turns (1000
            # threads made a 1 s job take 6 minutes)
            logger.warning("%d threads requested, but this process may use %d cores: using %d",
                           n, usable_cores(), usable_cores())
            n = usable_cores()
        if self.is_cpu:
            with self._compute_lock:    # not while a compute plans with the old count
                self.lib.ggml_backend_cpu_set_n_threads(self.ptr, n)
        self.threads = n

    def compute(self, cgraph) -> None:
        with self._compute_lock:    # the ctypes call releases the GIL
            status = self.lib.ggml_backend_graph_compute(self.ptr, cgraph)
        if status != 0:
            raise BackendError(f"ggml graph compute failed on {self.name} (status {status})")

    def supports(self, tensor) -> bool:
        return bool(self.lib.ggml_backend_supports_op(self.ptr, tensor.ptr))

    def close(self) -> None:
        if self._ptr:
            self.lib.ggml_backend_free(self._ptr)
            self._ptr = None

    def __repr__(self):
        return f"Backend({self.name!r}, threads={self.threads})"


_default: dict[tuple[str, int | None], Backend] = {}
_default_lock = threading.Lock()


def get_backend(backend: "Backend | str | None" = None, threads: int | None = None) -> Backend:
    """A Backend instance: pass one through, or a shared one per (name, threads)."""
    if isinstance(backend, Backend):
        return backend
    key = ("cpu" if backend is None else str(backend).lower(), threads)   # "" is refused
    with _default_lock:   # models loaded from two threads share one backend, not two
        if key not in _default:
            _default[key] = Backend(key[0], threads)
        return _default[key]


class Allocator(NativeResource):
    """A persistent `ggml_gallocr`: reused by every graph run on it, growing to the largest."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.lib = backend.lib
        self._ptr = self.lib.ggml_gallocr_new(backend.buffer_type)
        if not self._ptr:
            raise BackendError("ggml_gallocr_new failed")
        self.current = None  # the graph whose tensors the buffer currently holds

    def reserve(self, graph) -> int:
        """Size the buffer for a worst-case graph now (no compute); returns its bytes."""
        if not self.lib.ggml_gallocr_reserve(self._ptr, graph.cgraph):
            raise BackendError(f"could not reserve a compute buffer for graph {graph.name!r}")
        self.current = None
        size = self.buffer_size
        logger.info("compute buffer for %s: %.1f MiB", graph.name, size / 2**20)
        return size

    def alloc(self, graph) -> None:
        if not self.lib.ggml_gallocr_alloc_graph(self._ptr, graph.cgraph):
            raise BackendError(f"could not allocate the compute buffer for graph {graph.name!r} "
                               "(out of memory?)")
        self.current = graph

    def compute(self, graph) -> None:
        self.backend.compute(graph.cgraph)

    @property
    def buffer_size(self) -> int:
        return self.lib.ggml_gallocr_get_buffer_size(self._ptr, 0) if self._ptr else 0

    def close(self) -> None:
        if self._ptr:
            self.lib.ggml_gallocr_free(self._ptr)
            self._ptr = None
            self.current = None


class Buffer(NativeResource):
    """A backend buffer owning tensors that outlive graphs (weights, KV caches)."""

    def __init__(self, lib, ptr, *, usage: int = 0, keepalive=None):
        if not ptr:
            raise BackendError("ggml could not allocate a backend buffer (out of memory?)")
        self.lib = lib
        self._ptr = ptr
        self._keepalive = keepalive  # e.g. the mmap a zero-copy CPU buffer points into
        lib.ggml_backend_buffer_set_usage(ptr, usage)

    @property
    def ptr(self):
        return self._ptr

    @property
    def size(self) -> int:
        return self.lib.ggml_backend_buffer_get_size(self._ptr) if self._ptr else 0

    def clear(self, value: int = 0) -> None:
        self.lib.ggml_backend_buffer_clear(self._ptr, value)

    def close(self) -> None:
        if self._ptr:
            self.lib.ggml_backend_buffer_free(self._ptr)
            self._ptr = None
        self._keepalive = None
