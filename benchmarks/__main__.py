"""Run the GPU benchmarks:
``python -m benchmarks [--quick] [--commit SHA] [--out DIR] [topic ...]``, or a topic's design
studies: ``python -m benchmarks --lab TOPIC [name ...]``.

Each ``benchmarks/bench_<topic>.py`` has ``run(quick: bool) -> list[dict]``; the rows are written
with the run's provenance (GPU, driver, versions, date, commit, measured copy bandwidth) to
``benchmarks/results/<topic>.json`` (or ``--out``). The lab's ``lab/<topic>/bench_<name>.py``
follow the same contract and write ``lab/<topic>/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from benchmarks import _harness

HERE = Path(__file__).resolve().parent
LAB = HERE.parent / "lab"


def main(argv: list[str] | None = None) -> int:
    lab = None
    if argv is None:
        argv = sys.argv[1:]
    if "--lab" in argv:  # the lab's benchmarks: another folder, the same contract
        i = argv.index("--lab")
        if i + 1 >= len(argv) or not (LAB / argv[i + 1]).is_dir():
            known = sorted(p.name for p in LAB.glob("*/") if list(p.glob("bench_*.py")))
            print(f"--lab needs a topic with benchmarks: one of {', '.join(known)}",
                  file=sys.stderr)
            return 2
        lab = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    where = LAB / lab if lab else HERE
    package = f"lab.{lab}" if lab else "benchmarks"
    topics_all = sorted(p.stem.removeprefix("bench_") for p in where.glob("bench_*.py"))
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument(
        "topics",
        nargs="*",
        metavar="topic",
        help=f"which to run (default: all of {', '.join(topics_all)})",
    )
    ap.add_argument("--quick", action="store_true", help="a smoke run: few sizes, short timings")
    ap.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD)")
    ap.add_argument("--out", type=Path, default=where / "results" if lab else _harness.RESULTS,
                    help="where the JSON files go")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.topics) - set(topics_all))
    if unknown:
        ap.error(f"unknown topic(s) {', '.join(unknown)}; choose from {', '.join(topics_all)}")

    import torch

    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    meta = _harness.provenance(args.commit)
    meta["copy_gbs"] = round(_harness.copy_bandwidth_gbs(), 1)
    meta["quick"] = args.quick
    print(f"{meta['gpu']}: copy ceiling {meta['copy_gbs']} GB/s")
    for topic in args.topics or topics_all:
        module = importlib.import_module(f"{package}.bench_{topic}")
        rows = module.run(quick=args.quick)
        path = _harness.write(topic, rows, meta, args.out)
        print(f"{topic}: {len(rows)} rows -> {path}")
        if hasattr(module, "summary"):
            print(module.summary(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
