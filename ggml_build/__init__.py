"""Install-time build of stock ggml for moss_tts: fetch the pinned source, build the shared
libraries with CMake (cached per source, flags and compiler), install them with a manifest.

    python -m ggml_build [--force] [--target DIR] [--print-manifest]
"""

from .build import BUILDER_VERSION as __version__
from .build import DEFAULT_TARGET, MANIFEST, build, install
from .proc import GgmlBuildError
from .source import cache_dir

__all__ = ["DEFAULT_TARGET", "MANIFEST", "GgmlBuildError", "build", "cache_dir", "install", "__version__"]
