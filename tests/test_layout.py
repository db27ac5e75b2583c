"""Layout rules of issue 22 that a grep can check: a family is named only by its own modules
and the registry, and a sampling knob's options field only by sampling.py, knobs.py and the
models (design.md §1: front ends reach the families through the registry and knobs.py)."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "moss_tts"


def files_naming(literal: str) -> set[str]:
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if literal in p.read_text(encoding="utf-8")}


def test_local_v15_is_named_only_by_its_modules_and_the_registry():
    assert files_naming('"local-v15"') <= {"models/local_v15.py", "models/local_v15_tts.py",
                                            "models/registry.py", "text/local_v15_prompts.py"}


def test_an_options_field_is_named_only_by_sampling_knobs_and_models():
    for field in ('"audio_temperature"', '"audio_top_k"', '"text_temperature"'):
        outside = {f for f in files_naming(field)
                   if not re.match(r"(sampling\.py|knobs\.py|models/)", f)}
        assert not outside, (field, outside)


def test_no_front_end_imports_a_family_module():
    front = [p for p in PACKAGE.rglob("*.py")
             if p.relative_to(PACKAGE).parts[0] in ("cli", "server", "batch")]
    assert len(front) > 15      # the front-end packages were found
    family = re.compile(r"models\.(nano|delay|local|local_v15|realtime)(_tts)?\b")
    for path in front:
        assert not family.search(path.read_text(encoding="utf-8")), path
