"""The build environment: cmake, the C/C++ compilers, the generator, and the CMake flags chosen by
the MOSS_TTS_GGML_* environment variables."""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .proc import GgmlBuildError, first_line

CMAKE_MIN = (3, 14)

# Always set: a shared, CPU-backed, statically registered (no dlopen'd backends) Release build.
FIXED_FLAGS = {
    "CMAKE_BUILD_TYPE": "Release",
    "BUILD_SHARED_LIBS": "ON",
    "GGML_CPU": "ON",
    "GGML_LLAMAFILE": "ON",
    "GGML_BACKEND_DL": "OFF",
    "GGML_CCACHE": "OFF",
    "GGML_BUILD_TESTS": "OFF",
    "GGML_BUILD_EXAMPLES": "OFF",
}

# Environment variable → (CMake option, default).
ENV_FLAGS = {
    "MOSS_TTS_GGML_NATIVE": ("GGML_NATIVE", True),
    "MOSS_TTS_GGML_OPENMP": ("GGML_OPENMP", True),
    "MOSS_TTS_GGML_CUDA": ("GGML_CUDA", False),
    "MOSS_TTS_GGML_VULKAN": ("GGML_VULKAN", False),
    "MOSS_TTS_GGML_METAL": ("GGML_METAL", False),
    "MOSS_TTS_GGML_BLAS": ("GGML_BLAS", False),
    # on by default: ggml's RPC backend is the one non-host backend a CPU-only machine can run,
    # so the device path (uploads, copies in and out, the scheduler) is tested everywhere
    # (tests/ggml/test_rpc.py, tests/models/test_rpc_backend.py); it costs a small library
    "MOSS_TTS_GGML_RPC": ("GGML_RPC", True),
}
# Passed to CMake only when turned on (ggml's own default is off)
ONLY_WHEN_ON = {"GGML_RPC"}
# With RPC: TCP only. ggml would otherwise turn RDMA on wherever it finds libibverbs, tying the
# libraries to it; a test talks to a local rpc server and needs no RDMA.
RPC_FLAGS = {"GGML_RPC_RDMA": "OFF"}
EXTRA_ARGS_ENV = "MOSS_TTS_GGML_CMAKE_ARGS"

_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no"}


@dataclass(frozen=True)
class Compiler:
    path: str
    version: str  # first line of `--version`, e.g. "gcc (Debian 12.2.0-14) 12.2.0"


def cmake_flags() -> tuple[dict[str, str], list[str]]:
    """The -D flags (fixed, then env switches, then -D items of MOSS_TTS_GGML_CMAKE_ARGS) and the
    remaining raw arguments of MOSS_TTS_GGML_CMAKE_ARGS."""
    flags = dict(FIXED_FLAGS)
    for var, (option, default) in ENV_FLAGS.items():
        on = _env_bool(var, default)
        if on or option not in ONLY_WHEN_ON:
            flags[option] = "ON" if on else "OFF"
    if flags.get("GGML_RPC") == "ON":
        flags.update(RPC_FLAGS)
    extra = []
    args = iter(shlex.split(os.environ.get(EXTRA_ARGS_ENV, "")))
    for arg in args:
        if arg == "-D":
            arg = "-D" + next(args, "")
        if arg.startswith("-D") and "=" in arg:
            name, value = arg[2:].split("=", 1)
            flags[name.split(":", 1)[0]] = value  # drop a ":TYPE" suffix
        else:
            extra.append(arg)
    return flags, extra


def _env_bool(var: str, default: bool) -> bool:
    value = os.environ.get(var, "").strip().lower()
    if not value:
        return default
    if value in _TRUE | _FALSE:
        return value in _TRUE
    raise GgmlBuildError(f"{var}={os.environ[var]!r}: expected 1 or 0 (on/off, true/false, yes/no)")


def find_cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise GgmlBuildError("cmake not found on PATH — install it "
                             "(apt-get install cmake, or pip install cmake)")
    line = first_line([cmake, "--version"]) or ""
    match = re.search(r"(\d+)\.(\d+)", line)
    if match is None:
        raise GgmlBuildError(f"{cmake} --version printed {line!r}, not a cmake version — reinstall cmake")
    if tuple(map(int, match.groups())) < CMAKE_MIN:
        raise GgmlBuildError(f"{line} is too old; ggml needs cmake >= {'.'.join(map(str, CMAKE_MIN))} "
                             "— pip install cmake")
    return cmake


def find_compilers() -> dict[str, Compiler]:
    """The C and C++ compilers CMake will pick: $CC/$CXX, else the first of its default names."""
    found = {}
    for lang, var, names in (("c", "CC", ("cc", "gcc", "clang")), ("cxx", "CXX", ("c++", "g++", "clang++"))):
        if sys.platform == "win32":
            names = ("cl",) + names
        if os.environ.get(var):
            name = shlex.split(os.environ[var])[0]
            path = shutil.which(name)
            if path is None:
                raise GgmlBuildError(f"{var}={os.environ[var]!r}: compiler {name} not found")
        else:
            path = next(filter(None, map(shutil.which, names)), None)
        if path is None:
            raise GgmlBuildError(f"no {'C' if lang == 'c' else 'C++'} compiler found on PATH (tried "
                                 f"{', '.join(names)}) — install one (apt-get install build-essential; "
                                 "macOS: xcode-select --install)")
        found[lang] = Compiler(path, first_line([path, "--version"]) or "unknown")
    return found


def generator_args() -> list[str]:
    """Ninja when it is on PATH, unless $CMAKE_GENERATOR already chooses."""
    if os.environ.get("CMAKE_GENERATOR") or shutil.which("ninja") is None:
        return []
    return ["-G", "Ninja"]


def rpath_origin() -> str:
    """The RPATH entry meaning "the folder of this library"."""
    return "@loader_path" if sys.platform == "darwin" else "$ORIGIN"


def native_cpu() -> tuple[str, str]:
    """(model name, feature flags) of the host CPU: a GGML_NATIVE build is only valid on such a CPU."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        fields: dict[str, str] = {}
        for line in cpuinfo.read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
        model = fields.get("model name") or fields.get("CPU part") or platform.machine()
        return model, fields.get("flags") or fields.get("Features") or ""
    return platform.processor() or platform.machine(), ""


def shared_lib_names(directory: Path) -> list[str]:
    """File names of the ggml shared libraries in `directory` (any platform)."""
    patterns = ("libggml*.so", "libggml*.dylib", "ggml*.dll")
    return sorted({p.name for pattern in patterns for p in directory.glob(pattern) if p.is_file()})
