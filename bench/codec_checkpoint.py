"""Random MOSS audio codec checkpoints at real dimensions, for bench/codec.py (24 kHz v1) and
bench/codec48k.py (Nano and v2, 48 kHz stereo): one tensor plan for both key layouts (the names
and shapes fixtures/make_codec.py writes), each tensor's seeded init by its name, and the writer
of ≤ 1 GiB safetensors shards, one shard in memory at a time."""

from __future__ import annotations

import json
import math
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INDEX_FILE = "model.safetensors.index.json"
WN_G, WN_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
SHARD_BYTES = 1 << 30          # ≤ 1 GiB of f32 per shard: generation memory stays bounded


@dataclass(frozen=True)
class Layout:
    """A codec family's key layout: its attention and MLP weight names under a transformer
    layer, and whether a block projection (a stage's input / output projection, the quantizer's
    and each codebook's) is stored always or only where its two dims differ."""

    attn_in: str
    attn_out: str
    ffn_in: str
    ffn_out: str
    every_projection: bool


V1 = Layout("self_attn.in_projs.0", "self_attn.out_projs.0", "linear1", "linear2", False)
NANO_V2 = Layout("self_attn.in_proj", "self_attn.out_proj", "ffn.0", "ffn.2", True)


def checkpoint_plan(config: dict, layout: Layout) -> list[tuple[str, tuple, str, int]]:
    """Every upstream tensor as (name, shape, init, fan_in), in a fixed order: fused q|k|v, no
    bias on block linears, quantizer 1×1 convs as weight-norm pairs + bias."""
    plan = []

    def stored(n_in, n_out) -> bool:
        return layout.every_projection or n_in != n_out

    for tower in ("encoder", "decoder"):
        for i, kw in enumerate(config[f"{tower}_kwargs"]):
            if kw["module_type"] != "Transformer":
                continue
            p, d, ffn = f"{tower}.{i}.", kw["d_model"], kw["dim_feedforward"]
            din = kw["input_dimension"]
            if stored(din, d):
                plan.append((p + "input_proj.weight", (d, din), "dense", din))
            for layer in range(kw["num_layers"]):
                lp = f"{p}transformer.layers.{layer}."
                for norm in ("norm1", "norm2"):
                    plan.append((lp + norm + ".weight", (d,), "norm_w", 0))
                    plan.append((lp + norm + ".bias", (d,), "norm_b", 0))
                plan.append((f"{lp}{layout.attn_in}.weight", (3 * d, d), "dense", d))
                plan.append((f"{lp}{layout.attn_out}.weight", (d, d), "dense", d))
                plan.append((f"{lp}{layout.ffn_in}.weight", (ffn, d), "dense", d))
                plan.append((f"{lp}{layout.ffn_out}.weight", (d, ffn), "dense", ffn))
                plan.append((lp + "layer_scale_1.scale", (d,), "scale", 0))
                plan.append((lp + "layer_scale_2.scale", (d,), "scale", 0))
            if stored(d, kw["output_dimension"]):
                plan.append((p + "output_proj.weight", (kw["output_dimension"], d), "dense", d))
    q = config["quantizer_kwargs"]
    r, c = q.get("rvq_dim") or q["input_dim"], q["codebook_dim"]

    def wn(name, n_in, n_out):
        plan.extend([(name + WN_G, (n_out, 1, 1), "wn_g", 0),
                     (name + WN_V, (n_out, n_in, 1), "wn_v", 0), (name + ".bias", (n_out,), "bias", 0)])

    if stored(q["input_dim"], r):
        wn("quantizer.input_proj", q["input_dim"], r)
    if stored(r, q.get("output_dim", q["input_dim"])):
        wn("quantizer.output_proj", r, q.get("output_dim", q["input_dim"]))
    for i in range(q["num_quantizers"]):
        p = f"quantizer.quantizers.{i}."
        if stored(r, c):
            wn(p + "in_proj", r, c)
            wn(p + "out_proj", c, r)
        plan.append((p + "codebook.weight", (q["codebook_size"], c), "normal", 0))
    return plan


def random_tensor(seed: int, name: str, shape: tuple, init: str, fan_in: int) -> np.ndarray:
    """One random tensor, seeded by its name (independent of the sharding), float32 throughout."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if init == "dense":
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= np.float32(1.0 / math.sqrt(fan_in))
        return a
    if init == "norm_w":
        return (1.0 + 0.1 * rng.uniform(-1.0, 1.0, size=shape)).astype(np.float32)
    if init == "norm_b":
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)
    if init == "scale":       # layer scales (upstream init 0.01; the tiny fixture's range)
        return rng.uniform(0.1, 0.5, size=shape).astype(np.float32)
    if init == "wn_g":
        return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
    if init == "bias":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    return rng.standard_normal(shape, dtype=np.float32)        # wn_v, normal (codebooks)


def write_sharded(out_dir: Path, config: dict, plan, *, seed: int = 0,
                  shard_bytes: int = SHARD_BYTES, log=print) -> Path:
    """config.json + safetensors shards (≤ shard_bytes each) + index of `plan`'s random tensors,
    one shard in memory at a time."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    shards, cur, size = [], [], 0
    for entry in plan:
        nbytes = 4 * math.prod(entry[1])
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(entry)
        size += nbytes
    shards.append(cur)
    out_dir.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    t0 = time.perf_counter()
    for k, entries in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        part = {name: random_tensor(seed, name, shape, init, fan_in)
                for name, shape, init, fan_in in entries}
        save_file(part, str(out_dir / fname), metadata={"format": "pt"})
        total += sum(a.nbytes for a in part.values())
        weight_map.update({name: fname for name in part})
        del part
        log(f"  shard {k + 1}/{len(shards)} written ({total / 1e9:.2f} GB, "
            f"{time.perf_counter() - t0:.0f} s)")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return out_dir
