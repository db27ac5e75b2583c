"""The pinned stock ggml source: the tree vendored in a PyPI sdist (fetched with pip, verified by
sha256, cached), or a local checkout named by MOSS_TTS_GGML_SOURCE. No patches are applied."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .proc import GgmlBuildError, run_streamed, say

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_SUBDIR = "vendor/llama.cpp/ggml"      # ggml 0.25.3
SDIST_LICENSE = "vendor/llama.cpp/LICENSE"  # MIT; the ggml subtree carries no copy of its own
SOURCE_ENV = "MOSS_TTS_GGML_SOURCE"
CACHE_ENV = "MOSS_TTS_CACHE"


@dataclass(frozen=True)
class Source:
    ggml_dir: Path          # holds CMakeLists.txt and include/ggml.h
    license: Path | None
    info: dict              # the manifest's "source" entry
    is_checkout: bool       # a user's tree: let ggml read its git commit


def cache_dir() -> Path:
    """$MOSS_TTS_CACHE, else $XDG_CACHE_HOME/moss-tts, else ~/.cache/moss-tts."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "moss-tts"


def obtain_source() -> Source:
    override = os.environ.get(SOURCE_ENV)
    return _dir_source(Path(override)) if override else _sdist_source()


def ggml_version(ggml_dir: Path) -> str | None:
    """"MAJOR.MINOR.PATCH" from ggml's CMakeLists.txt, or None if it does not state one."""
    text = (ggml_dir / "CMakeLists.txt").read_text(encoding="utf-8", errors="replace")
    parts = [re.search(rf"set\(\s*GGML_VERSION_{p}\s+(\d+)\s*\)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else None


def tree_hash(ggml_dir: Path) -> str:
    """sha256 over the sorted relative paths and contents of the files the build reads."""
    h = hashlib.sha256()
    for rel in _build_inputs(ggml_dir):
        data = (ggml_dir / rel).read_bytes()
        h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _build_inputs(ggml_dir: Path) -> list[str]:
    # Top-level files plus cmake/, include/, src/: with tests and examples off that is all CMake
    # reads, and it keeps a checkout's .git/ or build/ folders out of the hash.
    files = [p for p in ggml_dir.iterdir() if p.is_file() and not p.name.startswith(".")]
    for sub in ("cmake", "include", "src"):
        for dirpath, dirnames, filenames in os.walk(ggml_dir / sub):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            files += [Path(dirpath) / f for f in filenames if not f.startswith(".")]
    return sorted(p.relative_to(ggml_dir).as_posix() for p in files)


def _dir_source(path: Path) -> Source:
    path = path.expanduser().resolve()
    if not (path / "CMakeLists.txt").is_file() or not (path / "include" / "ggml.h").is_file():
        hint = f" (did you mean {path / 'ggml'}?)" if (path / "ggml" / "include" / "ggml.h").is_file() else ""
        raise GgmlBuildError(f"{SOURCE_ENV}={path} is not a ggml source tree: it needs CMakeLists.txt "
                             f"and include/ggml.h{hint}")
    license = next((p for p in (path / "LICENSE", path.parent / "LICENSE") if p.is_file()), None)
    return Source(path, license, {"kind": "dir", "path": str(path)}, is_checkout=True)


def _sdist_source() -> Source:
    root = cache_dir() / "src" / f"{SDIST_NAME}-{SDIST_VERSION}-{SDIST_SHA256[:12]}"
    if not (root / ".complete").is_file():
        _extract(_fetch_sdist(), root)
    info = {"kind": "sdist", "name": f"{SDIST_NAME}=={SDIST_VERSION}", "sha256": SDIST_SHA256,
            "subdir": SDIST_SUBDIR}
    return Source(root / "ggml", root / "LICENSE", info, is_checkout=False)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch_sdist() -> Path:
    """The verified sdist in the cache, downloaded once with pip."""
    sdist_dir = cache_dir() / "sdist"
    cached = sdist_dir / f"{SDIST_NAME.replace('-', '_')}-{SDIST_VERSION}.tar.gz"
    if cached.is_file():
        if _sha256_file(cached) == SDIST_SHA256:
            return cached
        say(f"cached {cached.name} has the wrong sha256; downloading it again")
        cached.unlink()
    sdist_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=sdist_dir) as tmp:
        say(f"downloading the ggml source ({SDIST_NAME}=={SDIST_VERSION} sdist, ~77 MB, once) with pip ...")
        # --no-binary for this one package: we want its sdist. pip still prepares the sdist's
        # metadata (installing scikit-build-core in an isolated env), but builds nothing.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_NAME,
               "--dest", tmp, f"{SDIST_NAME}=={SDIST_VERSION}"]
        log = sdist_dir / "download.log"
        log.unlink(missing_ok=True)
        try:
            run_streamed(cmd, log=log, env=_pip_env(), what="pip download of the ggml source")
        except GgmlBuildError as e:
            raise GgmlBuildError(f"{e} — without package-index access, set {SOURCE_ENV} to a ggml "
                                 f"checkout, or put the sdist at {cached}") from None
        got = sorted(Path(tmp).glob("*.tar.gz"))
        if len(got) != 1:
            raise GgmlBuildError(f"pip download left {len(got)} .tar.gz files in {tmp}, expected one sdist")
        digest = _sha256_file(got[0])
        if digest != SDIST_SHA256:
            raise GgmlBuildError(f"{got[0].name}: sha256 {digest} does not match the pinned {SDIST_SHA256}")
        os.replace(got[0], cached)
    return cached


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    if importlib.util.find_spec("pip") is None:
        # Inside pip's isolated build env (setup.py), a sitecustomize on PYTHONPATH hides the
        # interpreter's own site-packages, and pip with it; the child gets them back.
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONNOUSERSITE", None)
    return env


def _extract(sdist: Path, root: Path) -> None:
    """Unpack only the ggml subtree (as root/ggml) and the license (root/LICENSE), atomically."""
    say(f"extracting {SDIST_SUBDIR} from {sdist.name} ...")
    tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist, "r:gz") as tar:
        members = _select_members(tar)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, members=members, filter="data")
        else:  # Python < 3.10.12 / 3.11.4: _select_members already admits plain files only
            tar.extractall(tmp, members=members)
    if not (tmp / "ggml" / "include" / "ggml.h").is_file():
        raise GgmlBuildError(f"{sdist} has no {SDIST_SUBDIR}/include/ggml.h")
    (tmp / ".complete").write_text("")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


def _select_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    selected = []
    for member in tar:
        parts = PurePosixPath(member.name).parts
        rel = "/".join(parts[1:])  # drop the sdist's top folder, "llama_cpp_python-0.3.36"
        if rel == SDIST_LICENSE:
            new_name = "LICENSE"
        elif rel.startswith(SDIST_SUBDIR + "/"):
            new_name = "ggml/" + rel[len(SDIST_SUBDIR) + 1:]
        else:
            continue
        if not (member.isfile() or member.isdir()) or ".." in parts or member.name.startswith("/"):
            raise GgmlBuildError(f"refusing unsafe member {member.name!r} in the ggml sdist")
        member.name = new_name
        selected.append(member)
    return selected
