"""Compiling Triton and Gluon kernels for sm_90 on a machine without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def compiled_offline(code: str):
    """The JSON that python code prints last, run in a process without the interpreter
    (TRITON_INTERPRET unset), with src/ and the repository on its path: where triton.compile can
    build sm_90 code on a machine without a GPU."""
    root = Path(__file__).resolve().parent.parent
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root)])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
