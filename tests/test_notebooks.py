"""Every notebook under docs/notebooks executes top to bottom, as mkdocs-jupyter runs it at
build."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "docs" / "notebooks").glob("*.py"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "docs/notebooks holds no jupytext notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
    import jupytext
    import nbclient

    # the kernel is a subprocess: it sees src/ through PYTHONPATH and inherits TRITON_INTERPRET
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = jupytext.read(path)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )  # cwd as in mkdocs
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert errors == []
    assert any(c.cell_type == "code" and c.get("outputs") for c in nb.cells), (
        "no cell produced output"
    )


def test_every_notebook_is_linked_from_a_post():
    posts = {p.name: p.read_text() for p in (ROOT / "docs" / "posts").glob("*.md")}
    for nb in NOTEBOOKS:
        linking = [name for name, text in posts.items() if f"../notebooks/{nb.name})" in text]
        assert linking, f"no post links docs/notebooks/{nb.name}"
