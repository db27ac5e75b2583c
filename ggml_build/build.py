"""Build stock ggml once per (source, flags, compiler) into the user cache, then install its shared
libraries, headers and a manifest next to moss_tts (or into the folder setup.py asks for)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .proc import GgmlBuildError, run_streamed, say
from .source import Source, cache_dir, ggml_version, obtain_source, tree_hash
from .toolchain import (Compiler, cmake_flags, find_cmake, find_compilers, generator_args,
                        native_cpu, rpath_origin, shared_lib_names)

BUILDER_VERSION = "0.1.0"  # part of the cache key: bump it whenever the build recipe changes
MANIFEST = "manifest.json"
LICENSE_NAME = "LICENSE-ggml.txt"
WRAPPER_DIR = Path(__file__).resolve().parent  # holds the wrapper CMakeLists.txt
DEFAULT_TARGET = WRAPPER_DIR.parent / "moss_tts" / "ggml" / "_lib"

# Loads every library in manifest order, as moss_tts does, then asks ggml for its version.
_LOAD_CHECK = """\
import ctypes, os, sys
for name in sys.argv[2:]:
    lib = ctypes.CDLL(os.path.join(sys.argv[1], name), mode=ctypes.RTLD_GLOBAL)
lib.ggml_version.restype = ctypes.c_char_p
print(lib.ggml_version().decode())
"""


@dataclass(frozen=True)
class Plan:
    source: Source
    source_hash: str
    version: str
    flags: dict[str, str]
    extra_args: list[str]
    compilers: dict[str, Compiler]
    native_cpu: tuple[str, str] | None
    key: str


def build(target_dir: str | os.PathLike | None = None, force: bool = False) -> dict:
    """Build ggml (or reuse the cached build) and install it into `target_dir`
    (default: moss_tts/ggml/_lib beside this package). Returns the manifest.

    >>> build()["libraries"]
    ['libggml-base.so', 'libggml-cpu.so', 'libggml.so']
    """
    target = Path(target_dir) if target_dir is not None else DEFAULT_TARGET
    cmake = find_cmake()  # check the tools before downloading anything
    compilers = find_compilers()
    flags, extra_args = cmake_flags()
    builds = cache_dir() / "ggml"
    builds.mkdir(parents=True, exist_ok=True)
    with _cache_lock(builds / ".lock"):          # the shared source, fetched once at a time
        plan = _plan(obtain_source(), flags, extra_args, compilers)
    built = builds / plan.key
    # one build of a key at a time; another key's (a CUDA build beside the CPU one that an
    # install or CI needs) neither waits for it nor makes it wait
    with _cache_lock(builds / f".{plan.key}.lock"):
        if force or not _is_complete(built):
            _build(plan, cmake, built)
        else:
            say(f"reusing the cached ggml {plan.version} build {built}")
        manifest = json.loads((built / MANIFEST).read_text())
    install(built, manifest, target)
    return manifest


def _is_complete(built: Path) -> bool:
    try:
        manifest = json.loads((built / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    names = manifest.get("libraries")
    return bool(names) and all((built / name).is_file() for name in names)


def _plan(source: Source, flags: dict[str, str], extra_args: list[str],
          compilers: dict[str, Compiler]) -> Plan:
    source_hash = tree_hash(source.ggml_dir)
    native = native_cpu() if flags.get("GGML_NATIVE") == "ON" else None
    material = {
        "builder": BUILDER_VERSION,
        "source": source.info,  # a checkout's git commit is compiled in, so its path counts too
        "source_hash": source_hash,
        "flags": sorted(flags.items()),
        "extra_args": extra_args,
        "compilers": {lang: [c.path, c.version] for lang, c in sorted(compilers.items())},
        "native_cpu": native,
        "platform": [sys.platform, platform.machine()],
    }
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    version = ggml_version(source.ggml_dir) or "unknown"
    return Plan(source, source_hash, version, flags, extra_args, compilers, native, key)


@contextlib.contextmanager
def _cache_lock(path: Path):
    """Hold an exclusive lock on `path` (two pip installs at once sharing a cache)."""
    with open(path, "a+") as f:
        try:
            import fcntl
        except ImportError:  # Windows: no lock; the final rename still keeps entries whole
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(plan: Plan, cmake: str, dest: Path) -> None:
    """Configure, compile and install into a temporary folder, then rename it to `dest`."""
    say(f"building ggml {plan.version} (this takes ~1 min) ...")
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".build-{plan.key[:12]}-", dir=dest.parent))
    log = dest.parent / f"{plan.key}.log"
    log.unlink(missing_ok=True)
    try:
        stage = _cmake_build(plan, cmake, work, log)
        out = work / "out"
        libraries = _assemble(stage, plan.source, out)
        seconds = round(time.monotonic() - start, 1)
        manifest = _manifest(plan, libraries, seconds)
        _check_loads(out, manifest)
        shutil.move(log, out / "build.log")
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # written last: marks it complete
        if dest.exists():  # --force
            shutil.rmtree(dest)
        os.replace(out, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"done in {seconds:.0f}s: {', '.join(libraries)} in {dest}")


def _cmake_build(plan: Plan, cmake: str, work: Path, log: Path) -> Path:
    build_dir, stage = work / "build", work / "stage"
    env = dict(os.environ)
    if not plan.source.is_checkout:
        # ggml asks git for its commit; keep git from reporting a repository around the cache.
        env["GIT_CEILING_DIRECTORIES"] = str(plan.source.ggml_dir.parent)
    configure = [
        cmake, "-S", str(WRAPPER_DIR), "-B", str(build_dir), *generator_args(),
        f"-DGGML_SOURCE_DIR={plan.source.ggml_dir}",
        *(f"-D{name}={value}" for name, value in plan.flags.items()),
        # Each library finds its siblings in its own folder: no LD_LIBRARY_PATH needed.
        f"-DCMAKE_INSTALL_RPATH={rpath_origin()}",
        "-DCMAKE_INSTALL_LIBDIR=lib",
        *plan.extra_args,
    ]
    jobs = str(os.cpu_count() or 1)
    run_streamed(configure, log=log, env=env, what="cmake configure of ggml")
    run_streamed([cmake, "--build", str(build_dir), "--config", "Release", "--parallel", jobs],
                 log=log, env=env, what="ggml compile")
    run_streamed([cmake, "--install", str(build_dir), "--config", "Release", "--prefix", str(stage)],
                 log=log, env=env, what="cmake --install of ggml")
    return stage


def _assemble(stage: Path, source: Source, out: Path) -> list[str]:
    """Copy the libraries (stage/lib, or stage/bin for DLLs), the headers and the license into `out`;
    return the library names in load order."""
    out.mkdir()
    names = []
    for folder in (stage / "lib", stage / "bin"):
        for name in shared_lib_names(folder):
            shutil.copy2(folder / name, out / name)
            names.append(name)
    if not names:
        raise GgmlBuildError(f"cmake --install put no ggml libraries into {stage}")
    (out / "include").mkdir()
    for header in sorted((source.ggml_dir / "include").glob("*.h")):
        shutil.copy2(header, out / "include" / header.name)
    if source.license is not None:
        shutil.copy2(source.license, out / LICENSE_NAME)
    return sorted(names, key=_load_rank)


def _lib_stem(name: str) -> str:
    """"libggml-cpu.so" → "ggml-cpu"."""
    stem = name.split(".")[0]
    return stem[3:] if stem.startswith("lib") else stem


def _load_rank(name: str) -> tuple[int, str]:
    # ggml-base first (everything links it), then the backends (cpu first), then ggml, which
    # links them all and registers them.
    stem = _lib_stem(name)
    order = {"ggml-base": 0, "ggml-cpu": 1, "ggml": 3}
    return order.get(stem, 2), stem


def _manifest(plan: Plan, libraries: list[str], seconds: float) -> dict:
    backends = [_lib_stem(n)[len("ggml-"):] for n in libraries if _lib_stem(n) not in ("ggml-base", "ggml")]
    return {
        "ggml_version": plan.version,
        "source": plan.source.info,
        "source_hash": plan.source_hash,
        "cache_key": plan.key,
        "flags": plan.flags,
        "extra_cmake_args": plan.extra_args,
        "compiler": plan.compilers["cxx"].version,
        "native_cpu": plan.native_cpu[0] if plan.native_cpu else None,
        "backends": backends,
        "libraries": libraries,
        "license": LICENSE_NAME if plan.source.license is not None else None,
        "builder_version": BUILDER_VERSION,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": seconds,
    }


def _check_loads(folder: Path, manifest: dict) -> None:
    """Load the fresh libraries in a child process, without LD_LIBRARY_PATH, as moss_tts will."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH")}
    result = subprocess.run([sys.executable, "-c", _LOAD_CHECK, str(folder), *manifest["libraries"]],
                            capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if result.returncode == 0:
        say(f"load check: ggml_version() = {result.stdout.strip()}")
        return
    reason = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
    if manifest["backends"] != ["cpu"]:
        # A GPU backend may need a driver that a build machine lacks; the CPU libs are still fine.
        say(f"warning: the libraries do not load on this machine ({reason})")
        return
    raise GgmlBuildError(f"the freshly built ggml libraries do not load: {reason}")


def install(built: Path, manifest: dict, target: Path) -> None:
    """Copy a cached build into `target`: libraries, include/, license, then the manifest last.
    Files are replaced by rename, so a process that has the old libraries loaded keeps working."""
    target.mkdir(parents=True, exist_ok=True)
    names = list(manifest["libraries"]) + ([manifest["license"]] if manifest.get("license") else [])
    for stale in set(shared_lib_names(target)) - set(names):
        (target / stale).unlink()
    for name in names:
        _replace_file(built / name, target / name)
    include_tmp = target / f".include.tmp{os.getpid()}"
    shutil.rmtree(include_tmp, ignore_errors=True)
    shutil.copytree(built / "include", include_tmp)
    shutil.rmtree(target / "include", ignore_errors=True)
    os.replace(include_tmp, target / "include")
    _replace_file(built / MANIFEST, target / MANIFEST)
    say(f"installed ggml {manifest['ggml_version']} ({', '.join(manifest['backends'])}) into {target}")


def _replace_file(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)
