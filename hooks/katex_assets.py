"""Copy KaTeX from node_modules (installed by `npm ci`) into the built site: math renders with no
CDN."""

from __future__ import annotations

from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

DIST = Path(__file__).resolve().parent.parent / "node_modules" / "katex" / "dist"
WANTED = ["katex.min.js", "katex.min.css", "contrib/auto-render.min.js"]


def on_files(files, config):
    if not DIST.is_dir():
        raise PluginError(f"KaTeX is not installed: run `npm ci` (looked in {DIST})")
    fonts = [f"fonts/{p.name}" for p in sorted((DIST / "fonts").glob("*.woff2"))]
    for rel in WANTED + fonts:
        files.append(File.generated(config, f"vendor/katex/{rel}", abs_src_path=str(DIST / rel)))
    return files
