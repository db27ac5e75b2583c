"""Building moss-tts builds stock ggml (ggml_build/), or reuses its cached build.

Metadata lives in pyproject.toml; this file only hooks the ggml build into `build_py`:
`pip install -e .` puts the libraries into moss_tts/ggml/_lib in the source tree, `pip install .`
(a wheel) into the build folder, so they ship inside the wheel.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
# ggml_build sits beside this file; pip's isolated build would not find it otherwise.
sys.path.insert(0, str(HERE))
import ggml_build  # noqa: E402


class build_py_with_ggml(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target = ggml_build.DEFAULT_TARGET
        else:
            target = Path(self.build_lib) / "moss_tts" / "ggml" / "_lib"
        try:
            ggml_build.build(target)
        except ggml_build.GgmlBuildError as e:
            raise SystemExit(f"ggml_build: {e}") from None


class bdist_wheel_native(bdist_wheel):
    """The wheel carries native libraries but no CPython extension: tag it py3-none-<platform>."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": build_py_with_ggml, "bdist_wheel": bdist_wheel_native})
