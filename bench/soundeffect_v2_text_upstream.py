"""Upstream's own MOSS-SoundEffect v2.0 text contexts on the tiny text encoder, written as
fixtures/data/soundeffect_v2_text_upstream.json for tests/models/test_soundeffect_v2_text.py:

    python bench/soundeffect_v2_text_upstream.py --upstream-src MOSS-TTS \\
        --golden fixtures/data/soundeffect_v2_text_upstream.json

Not a package dependency: runs in a venv with `torch`, `transformers==5.0.0`, `ftfy` and
`regex` (upstream's imports), numpy and this repository's fixtures (no moss_tts import: the
comparison is the test's). Upstream's files are read at run time from a checkout or a bare
mirror of OpenMOSS/MOSS-TTS (never copied into the project): `moss_soundeffect_v2/diffsynth/
prompters/{base_prompter,wan_prompter}.py` and `diffsynth/models/qwen3_text_encoder.py`, loaded
as a package of their own (the real `diffsynth/__init__.py` imports every pipeline). The
duration suffix is written out here as the pipeline's `__call__` does it
(pipeline_moss_soundeffect.py: `round(float(seconds), 1)`, then `f"{p.strip()} duration:
{seconds:.1f}s"` for the positive prompt only), since that closure cannot be imported alone.

Each case: WanPrompter(tokenizer_path, text_len=512) with Qwen3TextEncoder(path, float32)
fetched, `encode_prompt(text, positive=...)`, autocast off (§family-10.1). The fixture keeps
the valid rows only (a long prompt's first and last KEPT_ENDS) and checks here that every later row is zero.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import Upstream, upstream_commit, upstream_file, upstream_source  # noqa: E402
from fixtures.make_soundeffect_v2_text import make_text_encoder_checkpoint  # noqa: E402

SFX = Upstream("MOSS_TTS_UPSTREAM_TTS", "a clone of OpenMOSS/MOSS-TTS or its bare mirror",
               ("moss_soundeffect_v2/diffsynth",))
FILES = {"prompters/base_prompter.py": "diffsynth/prompters/base_prompter.py",
         "prompters/wan_prompter.py": "diffsynth/prompters/wan_prompter.py",
         "models/qwen3_text_encoder.py": "diffsynth/models/qwen3_text_encoder.py"}
SEED = 0
KEPT_ENDS = 8          # a long prompt's first and last rows kept (the fixture stays small)
LONG = " ".join(["Hello there, this is a tiny test of speech."] * 50)   # > 512 tiny tokens
# (name, prompt, seconds or None for a negative prompt)
CASES = (("positive", "Hello there, rain on a tin roof", 5.0),
         ("rounded", "  Chinese English 12345  ", 2.35),
         ("needs_cleaning", "“Hello”\u3000there&amp;amp;\t\n ﬁne ，world", 1.25),
         ("empty_negative", "", None),
         ("negative", "  speech  noise ", None),
         ("past_512", LONG, 30.0))


def load_upstream(src: Path, root: Path):
    """Upstream's prompter and encoder modules as the package `diffsynth` under `root`."""
    for name, dest in FILES.items():
        path = root / dest
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(upstream_file(src, name, SFX))
    for pkg in ("diffsynth", "diffsynth/prompters", "diffsynth/models"):
        (root / pkg / "__init__.py").write_text("")
    sys.path.insert(0, str(root))
    from diffsynth.models.qwen3_text_encoder import Qwen3TextEncoder
    from diffsynth.prompters.wan_prompter import WanPrompter

    return WanPrompter, Qwen3TextEncoder


def upstream_text(prompt: str, seconds: float | None) -> str:
    """What the pipeline hands the prompter: the positive prompt with its duration suffix."""
    if seconds is None:
        return prompt
    seconds = round(float(seconds), 1)
    return f"{prompt.strip()} duration: {seconds:.1f}s"


def kept_rows(n: int) -> list[int]:
    """The rows the fixture keeps: all of a short prompt's, the ends of a long one's."""
    return list(range(n)) if n <= 2 * KEPT_ENDS else \
        list(range(KEPT_ENDS)) + list(range(n - KEPT_ENDS, n))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream-src")
    ap.add_argument("--golden", help="write the fixture here")
    args = ap.parse_args(argv)
    src = upstream_source(args.upstream_src, SFX)
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        WanPrompter, Qwen3TextEncoder = load_upstream(src, Path(tmp) / "upstream")
        ckpt = make_text_encoder_checkpoint(Path(tmp) / "text_encoder", seed=SEED)
        prompter = WanPrompter(tokenizer_path=str(ckpt), text_len=512)
        prompter.fetch_models(Qwen3TextEncoder(str(ckpt), torch_dtype=torch.float32))
        cases = []
        for name, prompt, seconds in CASES:
            text = upstream_text(prompt, seconds)
            ids, mask = prompter.tokenizer(prompter.process_prompt(text), return_mask=True,
                                           add_special_tokens=True)
            n = int(mask.sum())
            ctx = prompter.encode_prompt(text, positive=seconds is not None, device="cpu")[0]
            ctx = ctx.float().numpy()
            assert ctx.shape[0] == 512 and not ctx[n:].any(), name
            kept = kept_rows(n)
            cases.append({"name": name, "prompt": prompt, "seconds": seconds, "text": text,
                          "ids": ids[0, :n].tolist(), "rows": n, "kept": kept,
                          "context": np.round(ctx[kept].astype(np.float64), 7).tolist()})
            print(f"{name}: {n} tokens, |context| max {np.abs(ctx).max():.3f}")
    golden = {"upstream": f"OpenMOSS/MOSS-TTS {upstream_commit(src)} moss_soundeffect_v2 "
                          "WanPrompter + Qwen3TextEncoder; transformers "
                          f"{transformers.__version__}, torch {torch.__version__} f32",
              "checkpoint": f"fixtures.make_soundeffect_v2_text seed {SEED}",
              "text_len": 512, "cases": cases}
    if args.golden:
        Path(args.golden).write_text(json.dumps(golden, separators=(",", ":")) + "\n")
        print(f"wrote {args.golden}")


if __name__ == "__main__":
    main()
