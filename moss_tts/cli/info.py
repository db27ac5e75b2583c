"""`python -m moss_tts doctor` (the ggml build, backends, threads, CPU features and a smoke
test) and `info` (a GGUF file's kind, metadata and tensor table)."""

from __future__ import annotations

import json
import platform

from .. import __version__
from ..errors import MossTTSError
from .common import printing


def _doctor(args) -> int:
    code = 0   # a reader that stopped early (`| head`) leaves it 0: it had what it wanted
    with printing():
        code = _print_doctor()
    return code


def _print_doctor() -> int:
    from ..ggml import backend, lib

    print(f"moss-tts {__version__} (python {platform.python_version()}, {platform.machine()})")
    try:
        manifest = lib.read_manifest()
        L = lib.get()
    except MossTTSError as e:
        print(f"ggml: NOT AVAILABLE — {e}")
        return 1
    src = manifest.get("source", {})
    origin = src.get("name") or src.get("path") or "?"
    print(f"ggml {L.ggml_version().decode()} (commit {L.ggml_commit().decode()}) from {origin}")
    print(f"  libraries: {L.lib_dir}")
    if manifest.get("source_hash"):
        print(f"  source sha256: {manifest['source_hash']}")
    flags = manifest.get("flags") or {}
    if flags:
        print("  build flags: " + " ".join(f"{k}={v}" for k, v in sorted(flags.items())))
    if manifest.get("compiler"):
        print(f"  compiler: {manifest['compiler']}")
    print(f"  cpu features: {' '.join(lib.cpu_features(L)) or 'none'}")
    print(f"  threads (default): {backend.default_threads()}")
    print("backends:")
    for d in backend.devices():
        mem = f", {d.memory_total / 2**30:.1f} GiB" if d.memory_total else ""
        print(f"  {d.registry.lower():8s} {d.name} — {d.description} [{d.kind}{mem}]")
    for name, why in backend.devices_missing().items():   # built where no device or driver is
        print(f"  {name:8s} built, but no device on this machine{f' ({why})' if why else ''}")
    if "rpc" in L.backends:   # servers are not enumerated: the user names one
        print("  rpc      any ggml RPC server: --backend rpc://HOST:PORT "
              "(serve this CPU with python -m moss_tts.ggml.rpc HOST:PORT)")
    with backend.Backend("cpu") as b:
        ok = _smoke_test(b)
    print(f"smoke test (2x2 matmul on cpu): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def _smoke_test(b) -> bool:
    import numpy as np

    from ..ggml import Graph, ops

    with Graph(b, name="doctor") as g:
        x = g.input("x", (2, 2))
        g.output(ops.mul_mat(x, x), "y")
        v = np.array([[1, 2], [3, 4]], dtype=np.float32)
        return bool(np.allclose(g.run({"x": v})["y"], v @ v.T))


def _info(args) -> int:
    from ..ggml.weights import GGUFFile

    with GGUFFile(args.file) as f:
        meta = {key: _plain(f.get(key)) for key in f.keys()}
        tensors = list(f.tensors.values())
        with printing():
            if args.json:   # machine-readable: every value in full, whatever --full says
                print(json.dumps({"file": str(f.path), "gguf_version": f.version, "metadata": meta,
                                  "tensors": [{"name": t.name, "type": t.type.name.lower(),
                                               "shape": list(t.shape), "bytes": t.nbytes}
                                              for t in tensors]}, indent=1, default=str))
            else:
                _print_info(f, meta, tensors, args.full)
    return 0


def _plain(value):
    """GGUF values as JSON-ready Python: arrays become lists (never numpy's abbreviated repr)."""
    return value.tolist() if hasattr(value, "tolist") else value


def _print_info(f, meta: dict, tensors: list, full: bool) -> None:
    from ..models.registry import CHECKPOINT_KEY

    total = sum(t.nbytes for t in tensors)
    # which published checkpoint of its architecture the weights are (MOSS-TTSD on Delay's)
    checkpoint = f", checkpoint {meta[CHECKPOINT_KEY]}" if meta.get(CHECKPOINT_KEY) else ""
    print(f"{f.path}: GGUF v{f.version}, kind {f.get('moss.kind', '(none)')}{checkpoint}, "
          f"{len(tensors)} tensors, {total / 2**20:.1f} MiB")
    print("metadata:")
    for key, value in meta.items():
        if isinstance(value, list) and len(value) > 8 and not full:
            value = value[:8] + [f"... ({len(value)} items)"]
        text = repr(value)
        if len(text) > 160 and not full:
            text = text[:157] + "..."
        print(f"  {key} = {text}")
    print("tensors:")
    shown = tensors if full or len(tensors) <= 60 else tensors[:60]
    for t in shown:
        print(f"  {t.name:60s} {t.type.name.lower():6s} {str(tuple(t.shape)):20s} {t.nbytes}")
    if len(shown) < len(tensors):
        print(f"  ... {len(tensors) - len(shown)} more (--full lists all)")


def commands() -> dict[str, str]:
    return {"doctor": "report the ggml build, backends, threads and CPU features",
            "info": "show a GGUF file's kind, metadata and tensor table"}


def add_flags(p, command: str, common) -> None:
    if command == "doctor":
        p.set_defaults(func=_doctor)
        return
    p.add_argument("file", help="a .gguf file")
    p.add_argument("--json", action="store_true", help="machine-readable output, never abbreviated")
    p.add_argument("--full", action="store_true", help="do not abbreviate long values")
    p.set_defaults(func=_info)
