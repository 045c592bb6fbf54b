"""mHC at small T with the host out of the way: every op captured in a CUDA graph and replayed,
T in {1, 128, 1024}, H in {4096, 7168}; the eager torch reference and torch.compile of it under
the same capture, in the same run.

Why a second mHC benchmark: ``bench_mhc`` times direct calls, as a caller without graphs makes
them. At small T those times are the host's (``mhc_pre`` is three launches from Python, each
tens of microseconds of host time on the benchmark machine), so they say little about the
kernels and wander with the host's speed. A serving stack replays graphs; ``graph_ms`` measures
what the GPU then spends per call. Inputs stay in L2 between replays when they fit, as they do
in a model's layer loop.
"""

from __future__ import annotations

import time

from benchmarks._harness import graph_ms
from benchmarks.bench_mhc import _calls

T_SMALL = (1, 128, 1024)
H_ALL = (4096, 7168)
T_QUICK, H_QUICK = (1,), (7168,)
COMPILE_BUDGET_S = 150.0  # capture no compiled peer after this many seconds spent on them


def run(quick: bool) -> list[dict]:
    import torch

    from kernelnotes.mhc import kernel
    from kernelnotes.mhc.torch_reference import (
        mhc_post_torch,
        mhc_pre_from_mixes_torch,
        mhc_pre_torch,
    )

    t0 = time.time()
    eager = (mhc_pre_torch, mhc_pre_from_mixes_torch, mhc_post_torch)
    impls = {"triton": (kernel.mhc_pre, kernel.mhc_pre_from_mixes, kernel.mhc_post),
             "eager": eager}
    if not quick:  # dynamic shapes: one graph for T > 1, one for T = 1, as in bench_mhc
        impls["compiled"] = tuple(torch.compile(f, dynamic=True) for f in eager)
    rows, compile_s = [], 0.0  # the budget counts the compiled peers' own time (their compiles)
    for H in H_QUICK if quick else H_ALL:
        for T in T_QUICK if quick else T_SMALL:
            for op, by_impl in _calls(impls, T, H).items():
                for impl, fn in by_impl.items():
                    row = {"op": op, "impl": impl, "T": T, "H": H, "timing": "cuda_graph"}
                    if impl == "compiled" and compile_s > COMPILE_BUDGET_S:
                        row["skipped"] = f"compile budget of {COMPILE_BUDGET_S:.0f} s spent"
                    else:
                        t1 = time.time()
                        try:
                            row["graph_ms"] = graph_ms(fn)
                        except Exception as e:  # noqa: BLE001  a peer that cannot be captured
                            row["skipped"] = f"{type(e).__name__}: {str(e)[:200]}"
                        if impl == "compiled":
                            compile_s += time.time() - t1
                    rows.append(row)
            torch.cuda.empty_cache()
    print(f"mhc_graph: done in {time.time() - t0:.0f} s", flush=True)
    return rows


def summary(rows: list[dict], meta: dict) -> str:
    graph = {(r["op"], r["impl"], r["T"], r["H"]): r["graph_ms"] for r in rows
             if r.get("graph_ms")}
    lines = ["mHC at small T, GPU time per call replayed from a CUDA graph"]
    for (op, impl, T, H), t in sorted(graph.items(), key=lambda kv: kv[0][2:] + kv[0][:2]):
        if impl == "triton":
            c = graph.get((op, "compiled", T, H))
            vs = f", torch.compile {1e3 * c:.1f} us ({c / t:.2f}x)" if c else ""
            lines.append(f"{op} T={T} H={H}: {1e3 * t:.1f} us{vs}")
    lines += [f"skipped: {r['op']} {r['impl']} T={r['T']} H={r['H']}: {r['skipped']}"
              for r in rows if r.get("skipped")]
    return "\n".join(lines)
