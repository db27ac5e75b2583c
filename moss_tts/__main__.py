"""`python -m moss_tts` → the command line."""

from .cli import main

raise SystemExit(main())
