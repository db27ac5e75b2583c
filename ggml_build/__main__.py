"""`python -m ggml_build`: build ggml (or reuse the cache) and install it into moss_tts/ggml/_lib."""

from __future__ import annotations

import argparse
import json
import sys

from . import DEFAULT_TARGET, GgmlBuildError, build, cache_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ggml_build",
        description="Build the pinned stock ggml shared libraries (cached in "
                    f"{cache_dir()}) and install them with a manifest.")
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached build matches")
    parser.add_argument("--target", metavar="DIR", default=None,
                        help=f"install folder (default: {DEFAULT_TARGET})")
    parser.add_argument("--print-manifest", action="store_true", help="print the manifest JSON to stdout")
    args = parser.parse_args(argv)
    try:
        manifest = build(args.target, force=args.force)
    except (GgmlBuildError, OSError) as e:
        print(f"ggml_build: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ggml_build: interrupted", file=sys.stderr)
        return 130
    if args.print_manifest:
        print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
