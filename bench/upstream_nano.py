"""Upstream PyTorch MOSS-TTS-Nano (f32) on the random real-dims checkpoint bench/nano.py writes:
time the prefill of the same 100-row prompt, peak RSS; save the last row's hidden state for the
parity check. Run it with a venv's python that has torch + transformers (never a dependency of
the package; from this repository it imports only bench/harness.py, bench/upstream_torch.py,
stdlib and numpy); bench/nano.py calls it with `--upstream PY`.

    /tmp/torchvenv/bin/python bench/upstream_nano.py [--ckpt bench/results/nano_real/checkpoint]
        [--work bench/results/nano_real] [--threads 2] [--runs 5] [--upstream-src DIR]

What is timed is the first step of upstream's generation loop
(MossTTSNanoForCausalLM._iter_generation_events, step 0): `_build_inputs_embeds` of the rows
(text embedding + the 16 masked audio embeddings) and the global GPT-2 `transformer` forward over
all rows with use_cache=True (12 layers, RoPE, sdpa attention, ln_f on every row; the returned
per-layer K/V are the cache). Not timed: the local transformer and heads of frame 1. Attention is
"sdpa", what upstream's runtime picks on CPU (flash_attention_2 needs CUDA).

The upstream files are copied at run time from the checkout (--upstream-src or
$MOSS_TTS_UPSTREAM_NANO: its files or its git HEAD, at the top or under models/llm/repo/) into
bench/results/upstream_nano/ (gitignored), never into the committed tree.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import re
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import NANO_TTS  # noqa: E402
from bench.upstream_torch import (  # noqa: E402
    assign,
    build_on_meta,
    copy_upstream,
    import_upstream,
    read_safetensors,
    timed,
    weight_gb,
)

WORK = ROOT / "bench" / "results" / "nano_real"
COPY_DIR = ROOT / "bench" / "results" / "upstream_nano"
FILES = ("modeling_moss_tts_nano.py", "gpt2_decoder.py", "configuration_moss_tts_nano.py",
         "prompting.py", "tokenization_moss_tts_nano.py")
ROWS_FILE = "prefill_rows.npy"           # written by bench/nano.py's prefill worker
HIDDEN_FILE = "prefill_hidden_upstream.npy"
ATTENTION = "sdpa"


def split_ignored(names, patterns) -> tuple[list[str], list[str]]:
    """Checkpoint names → (names to assign, names upstream ignores on load: those matching one of
    its `_keys_to_ignore_on_load_unexpected` patterns, e.g. the stale local_transformer.wte)."""
    keep, ignored = [], []
    for n in sorted(names):
        (ignored if any(re.search(p, n) for p in patterns) else keep).append(n)
    return keep, ignored


def cpu_config(config: dict) -> dict:
    """The checkpoint's config.json with both transformers on upstream's CPU attention (the
    file says flash_attention_2, which upstream's runtime replaces by sdpa without CUDA)."""
    return dict(config, attn_implementation=ATTENTION,
                local_transformer_attn_implementation=ATTENTION)


def _import_modeling():
    """The copied modeling module. It imports torchaudio at the top for reading and writing wav
    files only (none of it runs in a forward); where torchaudio is missing an empty stand-in
    module takes its place, so the torch venv needs no torchaudio. (The stand-in has a spec but
    no version or file, which transformers' own checks read as "not installed".)"""
    if importlib.util.find_spec("torchaudio") is None:
        stub = types.ModuleType("torchaudio")
        stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        sys.modules["torchaudio"] = stub
    return import_upstream(COPY_DIR, "modeling_moss_tts_nano")


def rope_tables(model, base: float) -> None:
    """Recompute the RoPE inverse frequencies on the CPU: a non-persistent buffer (not in the
    checkpoint), so building on the meta device left it empty; upstream's own class makes it."""
    gpt2 = import_upstream(COPY_DIR, "gpt2_decoder")
    for module in model.modules():
        if isinstance(module, gpt2.MossTTSNanoGPT2RotaryEmbedding):
            dim = 2 * module.inv_freq.shape[0]
            module.inv_freq = gpt2.MossTTSNanoGPT2RotaryEmbedding(dim, base=base).inv_freq


def load_model(ckpt: Path):
    """MossTTSNanoForCausalLM built on the meta device, the checkpoint assigned (strict, but for
    the names upstream ignores), the tied heads tied again to their sources."""
    import torch

    modeling = _import_modeling()
    config_mod = import_upstream(COPY_DIR, "configuration_moss_tts_nano")
    cls = modeling.MossTTSNanoForCausalLM
    config = config_mod.MossTTSNanoConfig(**cpu_config(json.loads((ckpt / "config.json").read_text())))
    model = build_on_meta(lambda: cls(config))
    rope_tables(model, config.gpt2_config.rope_base)
    state = read_safetensors(ckpt)
    keep, ignored = split_ignored(state, cls._keys_to_ignore_on_load_unexpected)
    assign(model, {n: state[n] for n in keep})
    # assign=True gave each tied head its own (identical) tensor: share them again, as upstream's
    # from_pretrained leaves them; check the checkpoint's copies really were equal first
    for head, src in model.all_tied_weights_keys.items():
        if not torch.equal(state[head], state[src]):
            raise SystemExit(f"{head} differs from its tied source {src} in the checkpoint")
    model.tie_weights()
    model._set_attention_implementation(ATTENTION)
    del state
    return model, ignored


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=str(WORK / "checkpoint"))
    ap.add_argument("--work", default=str(WORK))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5, help="warm runs (at least 5)")
    ap.add_argument("--upstream-src", default=None,
                    help=f"upstream MOSS-TTS-Nano checkout (default ${NANO_TTS.env})")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    commit = copy_upstream(COPY_DIR, FILES, NANO_TTS, args.upstream_src)
    work = Path(args.work)
    t0 = time.perf_counter()
    model, ignored = load_model(Path(args.ckpt))
    load_s = time.perf_counter() - t0
    rows = torch.from_numpy(np.load(work / ROWS_FILE).astype(np.int64))[None]   # [1, L, n_vq+1]
    mask = torch.ones(rows.shape[:2], dtype=torch.bool)

    def call():
        embeds = model._build_inputs_embeds(rows)
        out = model.transformer(input_ids=None, past_key_values=None, attention_mask=mask,
                                position_ids=None, inputs_embeds=embeds, use_cache=True,
                                output_attentions=False, output_hidden_states=False,
                                return_dict=True, cu_seqlens=None, num_sequences=None)
        return out.last_hidden_state[0, -1]

    hidden, stats = timed(call, max(5, args.runs))
    np.save(work / HIDDEN_FILE, hidden.numpy().astype(np.float32))
    print(json.dumps({"rows": int(rows.shape[1]), "load_s": load_s, **stats,
                      "ms": 1e3 * stats["median_s"], "weight_gb": weight_gb(model),
                      "attention": ATTENTION, "ignored": ignored, "upstream_commit": commit}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
