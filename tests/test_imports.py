"""Importing a topic costs nothing: the NumPy references load without torch or triton, and the
Triton launchers are found by name on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOPICS = sorted(p.parent.name for p in (ROOT / "src" / "kernelnotes").glob("*/reference.py"))


def test_every_topic_has_a_reference():
    assert {"newton", "linalg", "gd", "ffn", "mhc", "attention"} <= set(TOPICS)


def test_topics_and_references_import_without_torch_or_triton():
    code = (
        "import sys\n"
        + "".join(f"import kernelnotes.{t}, kernelnotes.{t}.reference\n" for t in TOPICS)
        + "heavy = sorted(m for m in ('torch', 'triton') if m in sys.modules)\n"
        + "assert not heavy, heavy\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "topic, name", [("newton", "sqrt"), ("linalg", "qr"), ("gd", "AdamW"), ("ffn", "linear_act"),
                    ("mhc", "mhc_post"), ("attention", "flash_attention")]
)
def test_launchers_resolve_lazily_and_unknown_names_fail_clearly(topic, name):
    import importlib

    module = importlib.import_module(f"kernelnotes.{topic}")
    assert callable(getattr(module, name))
    with pytest.raises(AttributeError,
                       match=f"module 'kernelnotes.{topic}' has no attribute 'nope'"):
        module.nope  # noqa: B018


def test_benchmark_provenance_names_the_commit_and_a_dirty_tree():
    import re

    from benchmarks import _harness

    commit = _harness._commit()
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", commit), commit
    if commit != "unknown":
        dirty = bool(_harness._git("status", "--porcelain", "--untracked-files=no"))
        assert commit.endswith("-dirty") == dirty


def test_benchmark_commit_label_is_refused_when_the_sources_differ(tmp_path):
    """--commit names the code that ran: in a repository where that commit's src/ differs from
    the tree's, the label is refused; the matching commit, a change only to results, and a
    commit git does not know (a copy without the newest history) are taken."""
    from benchmarks import _harness

    def git(*args):
        return _harness._git(*args, cwd=tmp_path)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "src").mkdir()
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    kernel, result = tmp_path / "src" / "k.py", tmp_path / "benchmarks" / "results" / "t.json"
    kernel.write_text("x = 1\n")
    result.write_text("{}\n")
    git("add", "-A")
    git("commit", "-qm", "first")
    first = git("rev-parse", "HEAD")
    assert _harness.check_commit(first, tmp_path) == first
    result.write_text('{"rows": []}\n')  # new results on the same code: still that commit
    assert _harness.check_commit(first, tmp_path) == first
    kernel.write_text("x = 2\n")  # the code that runs is no longer the commit's
    with pytest.raises(ValueError, match=f"--commit {first}: .* 1 file.*src/k.py"):
        _harness.check_commit(first, tmp_path)
    unknown = "0123456789abcdef0123456789abcdef01234567"
    assert _harness.check_commit(unknown, tmp_path) == unknown


@pytest.mark.parametrize("topic", TOPICS)
def test_every_public_name_resolves_and_dir_lists_it(topic):
    """__all__ is the topic's API (the API reference reads it without running the module): each
    name resolves, lazily or not, and dir() lists it, so completion and help() see it too."""
    import importlib

    module = importlib.import_module(f"kernelnotes.{topic}")
    assert len(set(module.__all__)) == len(module.__all__)
    missing = [n for n in module.__all__ if n not in dir(module)]
    assert missing == []
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_the_product_never_imports_the_lab():
    """lab/ holds design studies; the package, its tests and the posts use none of it, and no
    study module is left in src/ (the lab's code uses the package's public API, not the reverse)."""
    import re

    pattern = re.compile(r"^\s*(from|import)\s+lab(\.|\s|$)", re.M)
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "docs").rglob("*.md"), *(ROOT / "docs").rglob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in files if pattern.search(p.read_text())]
    assert offenders == []
    studies = {"onepass.py", "pipelined.py", "pingpong.py", "experiments.py"}
    assert not [p for p in (ROOT / "src").rglob("*.py") if p.name in studies]
    assert (ROOT / "lab").is_dir() and sorted((ROOT / "lab").glob("*/NOTES.md"))


def test_the_lab_imports_only_public_names_of_the_package():
    """A study that needs a helper makes it public in the package; it never reaches for a
    ``_private`` name or module of ``kernelnotes``."""
    import ast

    offenders = []
    for path in (ROOT / "lab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernelnotes"):
                names = [a.name for a in node.names] + node.module.split(".")
                offenders += [f"{path.relative_to(ROOT)}: {node.module}.{n}"
                              for n in names if n.startswith("_")]
    assert offenders == []


def test_the_readme_table_names_every_topic_benchmark_and_lab_folder():
    """The README's layout table is the one place a reader learns where each topic lives."""
    import re

    rows = {m[1]: (m[2], m[3]) for m in
            re.finditer(r"^\| `(\w+)` \| [^|]+ \| `(\w+)` \|\s*(`lab/\w+`)?\s*\|$",
                        (ROOT / "README.md").read_text(), re.M)}
    assert sorted(rows) == TOPICS
    benches = sorted(p.stem.removeprefix("bench_")
                     for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert sorted(bench for bench, _ in rows.values()) == benches
    labs = sorted(p.name for p in (ROOT / "lab").iterdir() if (p / "NOTES.md").is_file())
    assert sorted(lab.strip("`").removeprefix("lab/") for _, lab in rows.values() if lab) == labs
