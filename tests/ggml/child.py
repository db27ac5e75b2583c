"""Run a graph-building snippet in a child process, so a GGML_ASSERT / GGML_ABORT (which kills
the whole process) fails one test instead of the session. The snippet sees `np`, `g` (a Graph),
`ops`, `F16`, `F32`, `I32` and `GGMLType`; a package error is printed as `<ErrorClass> message`,
a clean run as `NO_ERROR`."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_graph_child(snippet: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import numpy as np
        from moss_tts.errors import MossTTSError
        from moss_tts.ggml import Graph, F16, F32, I32, GGMLType, ops
        g = Graph(name="child")
        try:
        {body}
        except MossTTSError as e:
            print(type(e).__name__, e)
        else:
            print("NO_ERROR")
    """).format(body=textwrap.indent(textwrap.dedent(snippet).strip(), "    "))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def death_detail(proc: subprocess.CompletedProcess) -> str:
    """The line of a dead child's stderr that says why (ggml's assert, else the last line)."""
    lines = proc.stderr.strip().splitlines() or ["(no stderr)"]
    return next((line for line in lines if "GGML" in line or "ggml" in line), lines[-1])
