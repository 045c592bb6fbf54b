"""Installed use: the wheel of this project, installed outside a source checkout, imports, runs a
kernel, ships its type information, and says clearly what needs a checkout (the committed
benchmark results the posts' tables read)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_USE = """
import os, sys
import torch
import kernelnotes, kernelnotes.newton as newton
from kernelnotes import _results

here = os.path.realpath(sys.argv[1])
assert os.path.realpath(kernelnotes.__file__).startswith(here), kernelnotes.__file__
assert os.path.isfile(os.path.join(os.path.dirname(kernelnotes.__file__), "py.typed"))
device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.tensor([4.0, 9.0, 2.0], device=device)
assert torch.equal(newton.sqrt(x), torch.sqrt(x))
try:
    _results.load("newton")
except _results.ResultsUnavailableError as e:
    assert "source checkout" in str(e), e
else:
    raise AssertionError("results were found outside a checkout")
print("installed use ok")
"""


def test_wheel_installed_outside_a_checkout_runs_and_says_what_needs_one(tmp_path):
    tree = tmp_path / "tree"  # build from a copy: an in-tree build would leave build/ behind
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # no build isolation: setuptools comes with the test extras, so this works offline too
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(tree)],
                   check=True, capture_output=True, text=True)
    wheel = next((tmp_path / "dist").glob("kernelnotes-*.whl"))
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True)
    env = dict(os.environ, PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, "-c", _USE, str(site)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "installed use ok" in proc.stdout
