"""Make pytest-markdown-docs test the code exactly as the built site shows it.

* Snippet includes (``--8<-- "src/...:section"``) are expanded with pymdownx's own preprocessor,
  configured from mkdocs.yml, so a fence is tested byte for byte as readers see it.
* Fences nested in content tabs (``=== "Triton"``) and admonitions are collected: CommonMark
  reads their indented bodies as code blocks, so those blocks are parsed again.
* Fence sources are served to ``linecache`` so ``inspect.getsource`` (``@triton.jit``) and
  tracebacks see the expanded fence, not the markdown file.

Which machine the suite runs on (CPU with the Triton interpreter, or a CUDA GPU) is decided in
``tests/_machine.py`` before anything imports Triton.
"""

from __future__ import annotations

import contextlib
import linecache
import re
from pathlib import Path
from unittest import mock

import pytest

from tests import _machine  # noqa: F401  (sets TRITON_INTERPRET=1 when there is no GPU)

ROOT = Path(__file__).resolve().parent
_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.M)
# the first line of a content tab or an admonition (=== "Triton", ??? check "...", !!! note)
_BLOCK_HEAD = re.compile(r"^( *)(===|\?\?\?\+?|!!!) .*$", re.M)


def _open_blocks(src: str) -> str:
    """Blank the head line of every tab and admonition, keeping the line count: their indented
    bodies then read as indented code blocks (parsed again below) even where no blank line
    follows the head, which CommonMark would otherwise fold into the head's paragraph."""
    return _BLOCK_HEAD.sub(r"\1", src)


def _mkdocs_yml() -> dict:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # !!python/name, !ENV
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def _snippet_preprocessor():
    import markdown

    conf: dict = {}
    for ext in _mkdocs_yml().get("markdown_extensions", []):
        if isinstance(ext, dict) and "pymdownx.snippets" in ext:
            conf = dict(ext["pymdownx.snippets"] or {})
    base = conf.get("base_path", ["."])
    base = [base] if isinstance(base, str) else base
    conf["base_path"] = [str(ROOT / b) for b in base]  # mkdocs resolves from its cwd, the repo root
    conf["check_paths"] = True
    md = markdown.Markdown(
        extensions=["pymdownx.snippets"], extension_configs={"pymdownx.snippets": conf}
    )
    return md.preprocessors["snippet"]


def pytest_markdown_docs_markdown_it():
    from markdown_it import MarkdownIt

    class DocsMarkdownIt(MarkdownIt):
        def __init__(self) -> None:
            super().__init__("commonmark")
            self._snippets = _snippet_preprocessor()

        def parse(self, src, env=None):
            return list(self._walk(super().parse(_open_blocks(src), env), 0))

        def _walk(self, tokens, offset):
            for tok in tokens:
                if tok.map:
                    tok.map = [tok.map[0] + offset, tok.map[1] + offset]
                if tok.type == "code_block" and _FENCE_LINE.search(tok.content):
                    # the body of a tab or admonition: parse it again as markdown
                    body = _open_blocks(tok.content)
                    yield from self._walk(super().parse(body), tok.map[0])
                    continue
                if tok.type == "fence" and "--8<--" in tok.content:
                    tok.content = "\n".join(self._snippets.run(tok.content.split("\n")))
                yield tok

    return DocsMarkdownIt()


@pytest.fixture(autouse=True)
def _fence_source_visible_to_inspect(request, monkeypatch):
    """A fence is compiled with the .md path as its filename; after snippet expansion its lines
    no longer match that file, so serve the fence's own source to linecache."""
    source = getattr(request.node, "code", None)  # set on pytest-markdown-docs items
    if source is None:
        return
    path, lines = str(request.node.path), source.splitlines(keepends=True)
    real = linecache.getlines
    monkeypatch.setattr(linecache, "getlines", lambda f, g=None: lines if f == path else real(f, g))
    if "torch.compile" in source:
        # Dynamo names the compiled function by tokenizing its file, the .md, whose prose can
        # fail Python's tokenizer (an uncaught IndentationError): it gets no names instead
        from torch._dynamo import funcname_cache

        monkeypatch.setitem(funcname_cache.cache, path, {})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """pytest-markdown-docs turns pytest's output capture off while a fence runs, so a fence's
    prints would land between the progress dots; keep capture on (a failing fence's output is
    still shown, under "Captured stdout call")."""
    if getattr(item, "code", None) is None:
        return (yield)
    capman = item.config.pluginmanager.getplugin("capturemanager")
    with mock.patch.object(capman, "global_and_fixture_disabled", contextlib.nullcontext):
        return (yield)


def pytest_report_header(config):
    return f"kernelnotes: {_machine.describe()}"


def pytest_collection_modifyitems(config, items):
    if _machine.ON_GPU:
        return
    gpu_only = [it for it in items if it.get_closest_marker("gpu")]
    if gpu_only:
        config.hook.pytest_deselected(items=gpu_only)
        items[:] = [it for it in items if not it.get_closest_marker("gpu")]


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"kernelnotes: {_machine.describe()}")
