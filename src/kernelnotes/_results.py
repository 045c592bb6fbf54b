"""Committed GPU benchmark results (``benchmarks/results/<topic>.json``), read by the posts.

The benchmark command writes these files on a CUDA machine; posts draw their tables and plots from
them and name the GPU and date they were measured on. Readable only from a source checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


class ResultsUnavailableError(FileNotFoundError):
    """The committed benchmark results are not where a source checkout keeps them."""


def load(topic: str) -> dict:
    """``{"meta": {...provenance...}, "rows": [{...}, ...]}`` for one topic.

    Raises:
        ResultsUnavailableError: outside a source checkout (an installed wheel ships no results),
            or in a checkout where the benchmark has not been run yet.
    """
    path = RESULTS / f"{topic}.json"
    if not RESULTS.is_dir():
        raise ResultsUnavailableError(
            f"benchmark results for {topic!r} are read from a source checkout of Kernel Notes "
            f"(benchmarks/results/); this kernelnotes is installed without one (looked in "
            f"{RESULTS}). The kernels work without them; only the posts' tables need them."
        )
    if not path.is_file():
        raise ResultsUnavailableError(
            f"no benchmark results for {topic!r}: run `bash scripts/dev bench {topic}` on a GPU "
            f"({path})"
        )
    return json.loads(path.read_text())


def provenance(meta: dict) -> str:
    """One line naming what the numbers were measured on (the results file keeps the date and
    commit too; the About page lists them)."""
    return (
        f"Measured on one {meta['gpu']} (driver {meta['driver']}, CUDA {meta['cuda']}), "
        f"torch {meta['torch']}, triton {meta['triton']}."
    )


def markdown_table(header: list[str], rows: list[list], align: str | None = None) -> str:
    """A markdown table; ``align`` is one of l/r/c per column (default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = {"l": ":--", "r": "--:", "c": ":-:"}
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule[a] for a in align) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def table_results() -> str:
    """Which GPU, software and commit produced each topic's committed benchmark results."""
    rows = []
    for path in sorted(RESULTS.glob("*.json")):
        meta = json.loads(path.read_text())["meta"]
        rows.append(
            [
                f"`{path.stem}`",
                meta["gpu"],
                meta["driver"],
                meta["torch"],
                meta["triton"],
                meta["date"][:10],
                f"{meta['copy_gbs']:.0f}",
            ]
        )
    if not rows:
        return ('!!! info "No benchmark results yet"\n'
                "    Run `bash scripts/dev bench` on a CUDA machine.")
    return markdown_table(
        ["results", "GPU", "driver", "torch", "triton", "measured", "copy GB/s"], rows
    )
