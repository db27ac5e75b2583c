"""What the upstream PyTorch peers share (bench/upstream_codec.py, bench/upstream_nano.py): copy
the upstream modeling files at run time into a gitignored package under bench/results/, load a
safetensors checkpoint into a model built on the meta device, and time a call (cold first call,
then warm runs) with the CPU share other processes took. Runs in a venv with torch; from this
repository it imports only bench/harness.py, stdlib and numpy (torch inside the functions), so
the drivers and the tests import it without torch.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402  (stdlib + numpy: fine in the torch venv)
    Contention,
    Upstream,
    peak_rss_gb,
    upstream_commit,
    upstream_file,
    upstream_source,
)


def copy_upstream(dest: Path, files: tuple[str, ...], kind: Upstream,
                  upstream_src: str | None) -> str:
    """Copy the upstream `files` into `dest` (a package: an empty __init__.py, so their relative
    imports resolve) and return the commit they came from ("?" when unknown). Without a source
    (no --upstream-src, no environment variable), an earlier run's copy is used."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = all((dest / f).exists() for f in files)
    if copied and not (upstream_src or os.environ.get(kind.env)):
        return "?"
    src = upstream_source(upstream_src, kind)
    for f in files:
        (dest / f).write_text(upstream_file(src, f, kind))
    (dest / "__init__.py").touch()
    return upstream_commit(src)


def import_upstream(dest: Path, module: str):
    """`module` of the copied package `dest` (imported as `<dest name>.<module>`)."""
    if str(dest.parent) not in sys.path:
        sys.path.insert(0, str(dest.parent))
    return importlib.import_module(f"{dest.name}.{module}")


def read_safetensors(ckpt: Path) -> dict:
    """Every tensor of a checkpoint directory (sharded with an index, or one model.safetensors)."""
    from safetensors.torch import load_file

    index = ckpt / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["model.safetensors"]
    state = {}
    for f in files:
        state.update(load_file(str(ckpt / f)))
    return state


def build_on_meta(make):
    """`make()` under the meta device: the module tree without allocating or initialising
    weights (they are assigned from the checkpoint afterwards)."""
    import torch

    with torch.device("meta"):
        return make()


def assign(model, state: dict, *, strict: bool = True):
    """Assign the checkpoint's tensors to the meta-built model (no second copy; weight-norm pairs
    load into their parametrizations) and check nothing stayed on the meta device."""
    result = model.load_state_dict(state, strict=strict, assign=True)
    model.eval()
    meta = [n for n, p in list(model.named_parameters()) + list(model.named_buffers())
            if p.device.type == "meta"]
    if meta:
        raise SystemExit(f"parameters left on the meta device: {meta[:5]}")
    return result


def timed(call, runs: int) -> tuple[object, dict]:
    """One cold call, then `runs` warm calls under inference_mode: (last output, the timing
    summary: cold_s, warm_s, median_s, min_s, foreign, peak_rss_gb)."""
    import torch

    times, foreign, out = [], [], None
    with torch.inference_mode():
        for _ in range(runs + 1):
            c = Contention()
            t = time.perf_counter()
            out = call()
            times.append(time.perf_counter() - t)
            foreign.append(c.share())
    warm = times[1:] or times
    return out, {"cold_s": times[0], "warm_s": warm, "median_s": statistics.median(warm),
                 "min_s": min(warm), "foreign": statistics.median(foreign[1:] or foreign),
                 "peak_rss_gb": peak_rss_gb(), "torch": torch.__version__,
                 "threads": torch.get_num_threads()}


def weight_gb(model) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
