"""The Errata page, generated from the posts: each post ends with one collapsed block

    ??? errata "Errata"
        - what the earlier version of the notes said, and what is true

and ``errata.md`` collects those bullet lists under a link to each post, so a correction is
written once and shown in both places.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

POSTS = Path(__file__).resolve().parent.parent / "docs" / "posts"
_BLOCK = re.compile(r'^\?\?\?\+? errata "[^"]*"\n((?:(?: {4}.*)?\n)+)', re.M)

INTRO = """# Errata

Each post was written from earlier notes, and those notes had mistakes. The posts state what is
true; what the notes got wrong is listed at the end of each post, in a folded *Errata* block, and
collected here. Every corrected value is computed by a check on its post.
"""


def errata(text: str, name: str) -> str | None:
    """The bullet list of a post's Errata block, dedented; None when the post has none."""
    blocks = _BLOCK.findall(text)
    if len(blocks) > 1:
        raise PluginError(f"{name} has {len(blocks)} errata blocks; a post has at most one")
    if not blocks:
        return None
    body = textwrap.dedent(blocks[0]).strip()
    if not body.startswith("- "):
        raise PluginError(f"{name}: an errata block holds a bullet list only")
    return body


def page() -> str:
    out = [INTRO]
    for path in sorted(POSTS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        title = re.search(r"^# (.+)$", text, re.M)
        if title is None:
            raise PluginError(f"{path.name} has no '# Title' line")
        body = errata(text, path.name)
        if body is not None:
            # links inside a post are relative to posts/; here they are one folder up
            body = re.sub(r"\]\((?!https?:|#|\.\./)([^)]+\.md(?:#[^)]*)?)\)", r"](posts/\1)", body)
            body = body.replace("](../", "](")
            out.append(f"## [{title.group(1).strip()}](posts/{path.name})\n\n{body}\n")
    return "\n".join(out)


def on_files(files, config):
    files.append(File.generated(config, "errata.md", content=page()))
    return files
