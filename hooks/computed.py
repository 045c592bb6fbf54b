"""Content computed at build time, so that no page carries a number or a picture code could make.

* Figures: every ``figure_<name>()`` in ``kernelnotes.<topic>.figures`` is drawn with matplotlib
  and written as ``figures/<topic>/<name>.svg``; a page links it as
  ``![...](../figures/<topic>/<name>.svg)``.
* Tables: a line ``{{ table <topic>.<name> }}`` is replaced by the markdown that
  ``kernelnotes.<topic>.figures.table_<name>()`` returns (worked examples, benchmark results);
  ``{{ table site.<name> }}`` takes ``kernelnotes._results.table_<name>()`` (site-wide tables).
"""

from __future__ import annotations

import importlib
import io
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
TOPICS = ROOT / "src" / "kernelnotes"
_TABLE = re.compile(r"^\{\{ table ([a-z_]+)\.([a-z0-9_]+) \}\}$", re.M)


def _figures_module(topic: str):
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    name = "kernelnotes._results" if topic == "site" else f"kernelnotes.{topic}.figures"
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise PluginError(f"kernelnotes.{topic}.figures could not be imported: {e}") from e


def _topics() -> list[str]:
    return sorted(p.parent.name for p in TOPICS.glob("*/figures.py"))


def _svg(fig) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "kernelnotes", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def on_files(files, config):
    for topic in _topics():
        module = _figures_module(topic)
        for name in sorted(n for n in dir(module) if n.startswith("figure_")):
            svg = _svg(getattr(module, name)())
            files.append(
                File.generated(
                    config, f"figures/{topic}/{name.removeprefix('figure_')}.svg", content=svg
                )
            )
    return files


def _table(match: re.Match) -> str:
    topic, name = match.groups()
    fn = getattr(_figures_module(topic), f"table_{name}", None)
    if fn is None:
        raise PluginError(f"no table_{name}() in kernelnotes.{topic}.figures")
    return fn().strip()


def on_page_markdown(markdown, page, config, files):
    return _TABLE.sub(_table, markdown)
