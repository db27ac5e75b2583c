"""Upstream's MossTTSLocal in PyTorch f32 on bench/local.py's random weights: the peer of its
per-frame table; and `python bench/local_upstream.py [SRC] [--golden OUT]`, a check that our
greedy frames equal upstream's own `generate` (temperatures 0) on the tiny test checkpoints,
which also writes fixtures/data/local_upstream_greedy.json. Not a package dependency: needs
`pip install torch transformers==5.0.0` (upstream's pin) and the upstream OpenMOSS/MOSS-TTS
code (a clone or a bare mirror) in --upstream-src or $MOSS_TTS_UPSTREAM_TTS.

The timed loop is upstream's `CustomMixin._sample` frame for frame
(moss_tts_local/modeling_moss_tts.py): the backbone with its KV cache over one new row, then
per depth position the depth transformer over the whole prefix (upstream recomputes), the
output adapter, the RMSNorm, the head and HF's processors (repetition penalty, temperature,
top-k, top-p) with a multinomial draw — timed by part, as ours is.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import median, prefill_times  # noqa: E402
from moss_tts.ggml.types import F32  # noqa: E402

ENV = "MOSS_TTS_UPSTREAM_TTS"
FILES = ("configuration_moss_tts.py", "modeling_moss_tts.py")
# inference_utils.py imports torchaudio for its audio helpers; modeling only takes
# find_last_equal_C from it, for generate()'s output parsing, which this loop does not use
INFERENCE_UTILS = ("def find_last_equal_C(*args, **kwargs):\n"
                   "    raise NotImplementedError('not used by bench/local_upstream.py')\n")


def upstream_package(src: str | None = None):
    """Import upstream's moss_tts_local (modeling + configuration) from a checkout or a bare
    mirror's HEAD, copied into a temporary package."""
    import subprocess

    root = Path(src or os.environ.get(ENV) or "")
    if not str(root) or not root.exists():
        raise SystemExit(f"no upstream MOSS-TTS source: set {ENV}=DIR (a clone of "
                         "OpenMOSS/MOSS-TTS or its bare git mirror)")
    pkg = Path(tempfile.mkdtemp(prefix="moss_tts_local_upstream_")) / "moss_tts_local"
    pkg.mkdir()
    for name in FILES:
        path = root / "moss_tts_local" / name
        text = path.read_text() if path.is_file() else subprocess.run(
            ["git", "-C", str(root), "show", f"HEAD:moss_tts_local/{name}"], check=True,
            capture_output=True, text=True).stdout
        (pkg / name).write_text(text)
    (pkg / "__init__.py").write_text("")      # only the two modules are needed
    (pkg / "inference_utils.py").write_text(INFERENCE_UTILS)
    sys.path.insert(0, str(pkg.parent))
    modeling = importlib.import_module("moss_tts_local.modeling_moss_tts")
    modeling.create_causal_mask = causal_mask_compat(modeling.create_causal_mask)
    return modeling, importlib.import_module("moss_tts_local.configuration_moss_tts")


def causal_mask_compat(create_causal_mask):
    """Upstream pins transformers 5.0.0, whose create_causal_mask took `input_embeds`,
    `past_key_values` and `cache_position`; later releases say `inputs_embeds` and `cache` and
    dropped the positions. (The depth attention ignores the mask anyway: it runs is_causal.)"""
    import inspect

    params = inspect.signature(create_causal_mask).parameters
    if "input_embeds" in params:
        return create_causal_mask
    renamed = {"input_embeds": "inputs_embeds", "past_key_values": "cache"}

    def call(**kw):
        kw = {renamed.get(k, k): v for k, v in kw.items()}
        return create_causal_mask(**{k: v for k, v in kw.items() if k in params})
    return call


def upstream_config(conf_module, cfg):
    lc = cfg.language_config
    language = dict(hidden_size=lc.hidden_size, num_hidden_layers=lc.num_hidden_layers,
                    num_attention_heads=lc.num_attention_heads,
                    num_key_value_heads=lc.num_key_value_heads, head_dim=lc.head_dim,
                    intermediate_size=lc.intermediate_size, rope_theta=lc.rope_theta,
                    rms_norm_eps=lc.rms_norm_eps, vocab_size=cfg.vocab_size,
                    max_position_embeddings=40960, tie_word_embeddings=False)
    return conf_module.MossTTSDelayConfig(
        language_config=language, n_vq=cfg.n_vq, audio_vocab_size=cfg.audio_vocab_size,
        audio_pad_code=cfg.audio_pad_code, local_num_layers=cfg.local_num_layers,
        local_hidden_size=cfg.local_hidden_size, local_ffn_hidden_size=cfg.local_ffn_hidden_size,
        additional_mlp_ffn_hidden_size=cfg.additional_mlp_ffn_hidden_size)


def state_dict(cfg, values: dict) -> dict:
    """Upstream names → f32 torch tensors of the same pooled values ours was written from."""
    import torch

    from converters.local import SOURCE_TEXT_EMBED, source_names

    names = {gguf: src for src, gguf in source_names(cfg).items()}

    def f32(v):
        if isinstance(v, np.ndarray):
            return torch.from_numpy(v.astype(np.float32))
        a = np.concatenate(list(v.encoded(F32))).view(np.float32).reshape(v.shape)
        return torch.from_numpy(a)
    sd = {names[n]: f32(v) for n, v in values.items()}
    # the frozen duplicate upstream keeps (never read): the same table
    sd["model.language_model.embed_tokens.weight"] = sd[SOURCE_TEXT_EMBED]
    return sd


def run_upstream(cfg, values: dict, rows: np.ndarray, frames: int, threads: int | None,
                 src: str | None = None) -> dict:
    import torch
    from transformers.generation.logits_process import (LogitsProcessorList,
                                                        RepetitionPenaltyLogitsProcessor,
                                                        TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    if threads:
        torch.set_num_threads(threads)
    modeling, conf = upstream_package(src)
    model = modeling.MossTTSDelayModel(upstream_config(conf, cfg)).float().eval()
    missing, unexpected = model.load_state_dict(state_dict(cfg, values), strict=False)
    if missing or unexpected:
        raise SystemExit(f"upstream state: missing {missing[:4]}, unexpected {unexpected[:4]}")
    procs = [LogitsProcessorList([TemperatureLogitsWarper(1.5), TopKLogitsWarper(50)])] + [
        LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.1), TemperatureLogitsWarper(1.0),
                             TopKLogitsWarper(50), TopPLogitsWarper(0.95)])] * cfg.n_vq
    ids = torch.from_numpy(rows)[None]
    torch.manual_seed(0)
    parts = []
    with torch.inference_mode():
        prefills = prefill_times(lambda: model.model(input_ids=ids, use_cache=True))
        t0 = time.perf_counter()
        out = model.model(input_ids=ids, use_cache=True)
        prefill = time.perf_counter() - t0
        for _ in range(frames):
            t0 = time.perf_counter()
            g = out.last_hidden_state[:, -1, :]
            t_depth = t_heads = t_sample = 0.0
            inputs = torch.zeros(1, 0, cfg.local_hidden_size)
            current = model.speech_embedding_to_local_mlp(g)
            tokens = []
            for c in range(cfg.n_vq + 1):
                t1 = time.perf_counter()
                inputs = torch.cat([inputs, current[:, None]], dim=1)
                h = model.local_transformer(input_ids=None, attention_mask=None,
                                            inputs_embeds=inputs)[0]
                y = model.layer_norm_before_lm_heads[c](
                    model.local_to_speech_embedding_mlps[c](h))
                t2 = time.perf_counter()
                logits = model.lm_heads[c](y[:, -1, :])
                t3 = time.perf_counter()
                if c:
                    logits[:, cfg.audio_pad_code] = -torch.inf
                scores = procs[c](ids[..., c], logits)
                tok = torch.multinomial(torch.softmax(scores, dim=-1), 1)[:, 0]
                t4 = time.perf_counter()
                tokens.append(tok)
                current = model.speech_embedding_to_local_mlp(model.model.embedding_list[c](tok))
                t_depth += (t2 - t1) + (time.perf_counter() - t4)
                t_heads += t3 - t2
                t_sample += t4 - t3
            row = torch.stack(tokens, dim=-1)[:, None]
            row[..., 0] = cfg.audio_assistant_gen_slot_token_id    # keep speaking, as ours
            ids = torch.cat([ids, row], dim=1)
            t5 = time.perf_counter()
            out = model.model(input_ids=row, past_key_values=out.past_key_values, use_cache=True)
            t6 = time.perf_counter()
            parts.append({"backbone": t6 - t5, "depth": t_depth, "heads": t_heads,
                          "sampling": t_sample,
                          "python": (t6 - t0) - (t6 - t5) - t_depth - t_heads - t_sample})
    warm = parts[2:] or parts
    res = {f"{k}_ms": 1e3 * median([p[k] for p in warm]) for k in parts[0]}
    return res | {"frame_ms": 1e3 * median([sum(p.values()) for p in warm]),
                  **prefills,
                  "first_audio_ms": 1e3 * (prefill + sum(sum(p.values()) for p in parts[:4])),
                  "threads": torch.get_num_threads()}


def greedy_rows(modeling, conf, cfg, state: dict, rows: np.ndarray, frames: int, *,
                penalty: float | None = None, n_vq: int | None = None) -> np.ndarray:
    """Upstream's own `generate` greedy: text_temperature = audio_temperature = 0, which its
    `_build_generation_config` turns into do_sample=False on every channel, so `_sample` runs
    no logits processor (no repetition penalty either) before the argmax → the new rows, the
    audio_end row included. `penalty` is passed through to show that it is ignored."""
    import torch

    model = modeling.MossTTSDelayModel(upstream_config(conf, cfg)).float().eval()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in
                           state.items()}, strict=True)
    ids = torch.from_numpy(rows)[None]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones(ids.shape[:2],
                                                                      dtype=torch.long),
                             max_new_tokens=frames, text_temperature=0, audio_temperature=0,
                             audio_repetition_penalty=penalty, n_vq_for_inference=n_vq,
                             return_dict_in_generate=True)
    return out.sequences[0, len(rows):].numpy().astype(np.int64)


# (checkpoint seed, prompt seed, audio_repetition_penalty, n_vq_for_inference): ending on
# audio_end, ending on the budget, a penalty strong enough to move a penalized argmax, and
# fewer channels
GREEDY_CASES = ((1, 7, None, None), (1, 2, None, None), (4, 3, None, None), (2, 4, None, None),
                (1, 7, 3.0, None), (1, 7, None, 2))
GREEDY_FRAMES = 10


def check(src: str | None = None, golden: str | None = None) -> int:
    """Ours == upstream's `generate`, greedy frame for frame, on the tiny test checkpoints;
    with `golden`, upstream's rows are written there (fixtures/data/local_upstream_greedy.json
    for tests/models/test_local_greedy.py)."""
    import json

    import torch
    import transformers

    from converters.local import convert, local_config
    from fixtures.make_local import make_state, make_tiny_local_checkpoint, tiny_config
    from moss_tts.ggml import F32 as F32_KV, Weights, get_backend
    from moss_tts.models.local import LocalModel
    from moss_tts.sampling import LocalSamplingOptions
    from tests.models.test_local import prompt_rows

    modeling, conf = upstream_package(src)
    failed, cases = 0, []
    for seed, prompt, penalty, n_vq in GREEDY_CASES:
        rows = prompt_rows(prompt)
        opts = LocalSamplingOptions(**({} if penalty is None else
                                       {"audio_repetition_penalty": penalty})).greedy()
        with tempfile.TemporaryDirectory() as d:
            ckpt = make_tiny_local_checkpoint(Path(d) / "hf", seed=seed, speech=True)
            model = LocalModel(Weights.load(convert(str(ckpt), Path(d) / "l.gguf", strict=True),
                                            get_backend(None, 1)), kv_type=F32_KV)
            try:
                ours = model.generate(rows, options=opts, max_new_frames=GREEDY_FRAMES,
                                      n_vq_for_inference=n_vq)
            finally:
                model.close()
        theirs = greedy_rows(modeling, conf, local_config(tiny_config()),
                             make_state(tiny_config(), seed, True), rows, GREEDY_FRAMES,
                             penalty=penalty, n_vq=n_vq)
        same = np.array_equal(ours, theirs)
        failed += not same
        print(f"seed {seed}, prompt {prompt}, penalty {penalty}, n_vq {n_vq}: {len(ours)} "
              f"frames, {'equal' if same else 'DIFFERENT'}")
        cases.append({"seed": seed, "prompt_seed": prompt, "audio_repetition_penalty": penalty,
                      "n_vq_for_inference": n_vq, "max_new_frames": GREEDY_FRAMES,
                      "prompt": rows.tolist(), "rows": theirs.tolist()})
    if golden:
        head = _git_head(src)
        Path(golden).write_text(json.dumps({
            "upstream": f"OpenMOSS/MOSS-TTS {head} moss_tts_local, transformers "
                        f"{transformers.__version__}, torch {torch.__version__} f32 eager, "
                        "MossTTSDelayModel.generate(text_temperature=0, audio_temperature=0)",
            "checkpoint": "fixtures.make_local make_tiny_local_checkpoint(seed, speech=True); "
                          "prompt tests.models.test_local.prompt_rows(prompt_seed)",
            "cases": cases}, separators=(",", ":")) + "\n")
        print(f"wrote {golden}")
    return failed


def _git_head(src: str | None) -> str:
    import subprocess

    root = src or os.environ.get(ENV) or "."
    r = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="our greedy Local frames vs upstream's generate")
    ap.add_argument("src", nargs="?", help=f"upstream MOSS-TTS checkout or mirror (${ENV})")
    ap.add_argument("--golden", help="write upstream's greedy rows to this JSON")
    args = ap.parse_args()
    raise SystemExit(check(args.src, args.golden))
