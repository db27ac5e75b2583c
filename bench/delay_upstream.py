"""Upstream's own MossTTSDelay prompts and greedy rows on the tiny test checkpoints, written as
fixtures/data/delay_upstream.json for tests/models/test_delay_upstream.py:

    python bench/delay_upstream.py --upstream-src MOSS-TTS --mlx-src MLX-AUDIO \\
        --golden fixtures/data/delay_upstream.json

Not a package dependency: runs in a venv with `torch` and `transformers==5.0.0` (upstream's pin),
numpy and this repository's fixtures (no moss_tts import: the comparison is the test's). The
upstream code is read at run time from a checkout or a bare mirror (never copied into the
project): OpenMOSS/MOSS-TTS `moss_tts_delay/` (processor, modeling, `generate`) and
`clis/moss_ttsd_app.py` (the TTSD app's dialogue functions), and, for MOSS-VoiceGenerator's
`normalize_inputs`, the two normalizers of mlx-audio's port of the processor shipped in that
model repo (at MLX_COMMIT; the repo's own file cannot be read offline, docs/upstream-notes.md
§family-9.2).

Each case is what an upstream app does: the message built by `build_user_message` (or, for
VoiceGenerator, by `UserMessage` after its processor's normalization), the rows by
`processor(conversations, mode=...)`, then `MossTTSDelayModel.generate(text_temperature=0,
audio_temperature=0)` on the tiny weights of fixtures.make_delay (gen_bias 4, so the model
starts audio). The tokenizer is the tiny tokenizer.json with Qwen's ChatML template without a
system prompt (the checkpoints' template is not readable offline; §family-2.4).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import Upstream, upstream_commit, upstream_file, upstream_source  # noqa: E402
from bench.upstream_torch import copy_upstream, import_upstream  # noqa: E402
from fixtures.make_delay import (PUBLISHED_N_VQ, make_state, make_tokenizer_json,  # noqa: E402
                                 tiny_config)

DELAY = Upstream("MOSS_TTS_UPSTREAM_TTS", "a clone of OpenMOSS/MOSS-TTS or its bare mirror",
                 ("moss_tts_delay",))
APPS = Upstream("MOSS_TTS_UPSTREAM_TTS", "a clone of OpenMOSS/MOSS-TTS or its bare mirror",
                ("clis",))
MLX_ENV = "MOSS_TTS_UPSTREAM_MLX_AUDIO"
MLX_COMMIT = "e011bb367ecfd3f79921c14eabaec6e5a1ee3e11"   # its port of VoiceGenerator's processor
MLX_PROCESSOR = "mlx_audio/tts/models/moss_tts/processor.py"
FILES = ("configuration_moss_tts.py", "modeling_moss_tts.py", "processing_moss_tts.py",
         "inference_utils.py", "tts_robust_normalizer_single_script.py")
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GEN_BIAS = 4.0
NEW_ROWS = 40
# the weights: `steady` speaks (AUDIO_START, then GEN rows); `noisy` wanders (text tokens,
# DELAY, the flush, AUDIO_END, text again): fixtures.make_delay make_state(steady=...)
WEIGHTS = {"steady": True, "noisy": False}


def upstream_delay(src: Path):
    """moss_tts_delay's processor and modeling, copied from `src` into a temporary package by
    the peers' shared copier (torchaudio, imported by the processor for its audio I/O, is a
    stub: no audio is read)."""
    pkg = Path(tempfile.mkdtemp(prefix="moss_tts_delay_upstream_")) / "moss_tts_delay"
    copy_upstream(pkg, FILES, DELAY, str(src))
    sys.modules.setdefault("torchaudio", types.ModuleType("torchaudio"))
    return tuple(import_upstream(pkg, m) for m in ("processing_moss_tts", "modeling_moss_tts",
                                                    "configuration_moss_tts"))


def functions_of(source: str, names: tuple[str, ...]) -> dict:
    """The named top-level functions of a Python source, defined in a namespace with `re` (the
    apps import gradio and torchaudio at the top: only these functions are taken)."""
    import re

    tree = ast.parse(source)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in keep}
    if missing:
        raise SystemExit(f"upstream source lacks {sorted(missing)}")
    namespace = {"re": re}
    exec(compile(ast.Module(keep, []), "<upstream>", "exec"), namespace)   # noqa: S102
    return namespace


def mlx_source(path: str | None) -> str:
    import os
    import subprocess

    src = path or os.environ.get(MLX_ENV)
    if not src:
        raise SystemExit(f"pass --mlx-src DIR or set {MLX_ENV}=DIR (Blaizzy/mlx-audio)")
    return subprocess.run(["git", "-C", src, "show", f"{MLX_COMMIT}:{MLX_PROCESSOR}"],
                          check=True, capture_output=True, text=True).stdout


def tokenizer():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(make_tokenizer_json()))
    tok.chat_template = CHATML
    return tok


def model_of(modeling, conf, config: dict, state: dict):
    import torch

    model = modeling.MossTTSDelayModel(conf.MossTTSDelayConfig(**config)).float().eval()
    model.load_state_dict({k: torch.tensor(v, dtype=torch.float32) for k, v in state.items()},
                          strict=True)
    return model


def codes(frames: int, n_vq: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 64, size=(frames, n_vq))


def cases(processing, app, vg):
    """(name, checkpoint kind, conversation, mode, what the port is asked): one per app path."""
    import torch

    build = processing.MossTTSDelayProcessor.build_user_message
    t = lambda c: torch.tensor(c)   # noqa: E731
    ref4 = codes(5, 4, 1)
    s1 = codes(6, PUBLISHED_N_VQ, 2)
    dialogue = "[S1] Hello there, how are you? [S2] Fine, thanks — and you?"
    ttsd_text = app["_merge_consecutive_speaker_tags"](app["_normalize_prompt_text"](
        "Hi, it's me.", 1) + app["normalize_text"](dialogue))
    ttsd_text = app["_validate_dialogue_text"](app["normalize_text"](ttsd_text), 2)
    instruction = "温柔的女声（轻声）,语速缓慢!!\n带一点笑意[smile]"
    vg_text = "Hello there!! \"Good morning\"【笑】."
    vg_message = processing.UserMessage(text=vg["normalize_text"](vg_text),
                                        instruction=vg["normalize_instruction"](instruction))
    return [
        # clis/moss_tts_app.py: direct generation, and voice clone (generation with a reference)
        ("tts_direct", "tts", [[build(text="Hello there, 你好。", language="Chinese",
                                      tokens=40)]], "generation",
         {"text": "Hello there, 你好。", "language": "Chinese", "tokens": 40}),
        ("tts_clone", "tts", [[build(text="Hello there.", reference=[t(ref4)])]], "generation",
         {"text": "Hello there.", "reference": ref4.tolist()}),
        # clis/moss_ttsd_app.py build_conversation: no reference → generation; S1 cloned, S2
        # left to the model → continuation with references [S1, None] and S1's speech
        ("ttsd_generation", "ttsd", [[build(text=app["normalize_text"](dialogue))]],
         "generation", {"text": dialogue}),
        ("ttsd_s2_left", "ttsd", [[build(text=ttsd_text, reference=[t(s1), None]),
                                   processing.MossTTSDelayProcessor.build_assistant_message(
                                       audio_codes_list=[t(s1)])]], "continuation",
         {"text": dialogue, "speakers": {"1": [s1.tolist(), "Hi, it's me."]}}),
        # clis/moss_voice_generator_app.py with the model repo's processor (normalize_inputs)
        ("voicegen", "voicegen", [[vg_message.to_dict()]], "generation",
         {"text": vg_text, "instruction": instruction}),
        # the SoundEffect card's snippet: ambient_sound and tokens, no text
        ("sfx", "sfx", [[build(ambient_sound="Rain on a tin roof.", tokens=12)]], "generation",
         {"sound": "Rain on a tin roof.", "tokens": 12}),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream-src")
    ap.add_argument("--mlx-src")
    ap.add_argument("--golden", help="write the fixture here")
    args = ap.parse_args(argv)

    import torch
    import transformers

    src = upstream_source(args.upstream_src, DELAY)
    processing, modeling, conf = upstream_delay(src)
    app = functions_of(upstream_file(src, "moss_ttsd_app.py", APPS), (
        "normalize_text", "_validate_dialogue_text", "_normalize_prompt_text",
        "_merge_consecutive_speaker_tags"))
    vg = functions_of(mlx_source(args.mlx_src), ("normalize_instruction", "normalize_text"))
    tok = tokenizer()
    configs = {"tts": tiny_config(), **{k: tiny_config(n_vq=PUBLISHED_N_VQ)
                                        for k in ("ttsd", "voicegen", "sfx")}}
    out = []
    torch.manual_seed(0)
    for (name, kind, conversations, mode, asked), weights in (
            (case, w) for case in cases(processing, app, vg) for w in WEIGHTS):
        config = configs[kind]
        processor = processing.MossTTSDelayProcessor(
            tokenizer=tok, model_config=conf.MossTTSDelayConfig(**config))
        batch = processor(conversations, mode=mode)
        rows = batch["input_ids"][0]
        state = make_state(config, 0, GEN_BIAS, steady=WEIGHTS[weights])
        model = model_of(modeling, conf, config, state)
        with torch.inference_mode():
            (_, generated), = model.generate(batch["input_ids"], batch["attention_mask"],
                                             max_new_tokens=NEW_ROWS, text_temperature=0,
                                             audio_temperature=0)
        # upstream returns the rows from the last <|im_start|> + 3 on (`generate`'s
        # start_indices): in continuation mode the prompt's assistant rows come first
        start = int((rows[:, 0] == config["im_start_token_id"]).nonzero()[-1]) + 3
        made = generated[len(rows) - start:]
        print(f"{name} ({weights}): {len(rows)} prompt rows ({mode}), {len(made)} new rows, "
              f"text {made[:6, 0].tolist()}...")
        out.append({"name": name, "kind": kind, "weights": weights, "mode": mode,
                    "asked": asked, "prompt": rows.tolist(), "rows": made.tolist()})
    if args.golden:
        Path(args.golden).write_text(json.dumps({
            "upstream": f"OpenMOSS/MOSS-TTS {upstream_commit(src)} moss_tts_delay and "
                        f"clis/moss_ttsd_app.py; mlx-audio {MLX_COMMIT[:8]} "
                        "normalize_instruction/normalize_text; transformers "
                        f"{transformers.__version__}, torch {torch.__version__} f32 eager, "
                        "processor(conversations, mode) then MossTTSDelayModel.generate("
                        "text_temperature=0, audio_temperature=0)",
            "checkpoints": f"fixtures.make_delay tiny_config (tts: n_vq 4; ttsd, voicegen, sfx: "
                           f"n_vq {PUBLISHED_N_VQ}), make_state(config, 0, {GEN_BIAS}, "
                           "steady=weights == 'steady')",
            "max_new_rows": NEW_ROWS, "cases": out}, separators=(",", ":")) + "\n")
        print(f"wrote {args.golden}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
