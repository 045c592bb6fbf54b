"""The whole mHC pre step at T = 8192 by three designs, in the same run: the two kernels of
``kernel.mhc_pre`` (the residual read twice), the eighth design ``onepass.mhc_pre_onepass`` and
the ninth ``pipelined.mhc_pre_pipelined`` (each reads it once); direct calls, interleaved, and
replays of a CUDA graph.

For the ninth, one call with the GPU timer's stamps says where a tile buffer's time goes: the
stages of its cycle from the TMA issue to the writer freeing it (medians, 10th and 90th
percentiles over all steps of all programs, in microseconds).
"""

from __future__ import annotations

import time

from benchmarks._harness import bench_interleaved, graph_ms
from benchmarks.bench_mhc import make_inputs

T = 8192
H_ALL, H_QUICK = (4096, 7168), (7168,)
DESIGNS = ("two-pass", "eighth", "ninth")


def _spread(x) -> dict:
    import torch

    q = torch.quantile(x.double().flatten(), torch.tensor([0.5, 0.1, 0.9], dtype=torch.float64))
    return {"us": round(q[0].item(), 2), "us_p10": round(q[1].item(), 2),
            "us_p90": round(q[2].item(), 2)}


def stages(stamps, H: int) -> dict:
    """{stage: {us, us_p10, us_p90}} from the stamps [programs, steps, 8] (ns) of one call."""
    import torch

    from lab.mhc import pipelined

    G = H // pipelined.BH
    programs, steps, _ = stamps.shape
    us = (stamps[..., :7] - stamps[..., 1][stamps[..., 1] > 0].min()).double().cpu() / 1e3
    issued, ready, written, arrived, published, seen, freed = us.unbind(-1)
    done = stamps[..., 0].cpu() > 0
    out = {"tma": _spread((ready - issued)[done]),
           "project": _spread((written - ready)[done]),
           "count in": _spread((arrived - written)[done])}
    # per token block: the slices of a block are the G programs of one lane at one step
    lanes = programs // G
    by_block = arrived.view(lanes, G, steps)
    last, first = by_block.max(1).values, by_block.min(1).values
    pub = torch.where(stamps[..., 4].cpu() > 0, published, torch.tensor(-1e30, dtype=torch.float64))
    pub = pub.view(lanes, G, steps).max(1).values
    ok = done.view(lanes, G, steps)[:, 0]
    out["arrival spread"] = _spread((last - first)[ok])
    out["publish"] = _spread((pub - last)[ok])
    out["seen"] = _spread((seen.view(lanes, G, steps) - pub[:, None])[done.view(lanes, G, steps)])
    out["write"] = _spread((freed - seen)[done])
    out["cycle"] = _spread((freed - issued)[done])
    return out


def run(quick: bool) -> list[dict]:
    import torch

    from kernelnotes.mhc import kernel
    from lab.mhc import onepass, pipelined

    t0 = time.time()
    rows = []
    for H in H_QUICK if quick else H_ALL:
        args = make_inputs(T, H)[:4]  # residual, fn, scale, base
        calls = {"two-pass": kernel.mhc_pre, "eighth": onepass.mhc_pre_onepass,
                 "ninth": pipelined.mhc_pre_pipelined}
        calls = {name: (lambda f=f, a=args: f(*a)) for name, f in calls.items()}
        for f in calls.values():  # compile outside the timings
            f()
        direct = bench_interleaved(calls)
        for name, f in calls.items():
            rows.append({"op": "mhc_pre", "impl": name, "T": T, "H": H, "ms": direct[name][0],
                         "ms_p20": direct[name][1], "ms_p80": direct[name][2],
                         "graph_ms": graph_ms(f)})
        pipelined.mhc_pre_pipelined(*args, stamps=True)  # warm
        *_, stamps = pipelined.mhc_pre_pipelined(*args, stamps=True)
        torch.cuda.synchronize()
        rows.append({"op": "mhc_pre", "impl": "ninth", "T": T, "H": H,
                     "stages": stages(stamps, H), "stamped_ms": (
                         (stamps[..., 6].max() - stamps[..., 0][stamps[..., 0] > 0].min())
                         .item() / 1e6)})
        del args, calls, stamps
        torch.cuda.empty_cache()
    print(f"mhc_onepass: done in {time.time() - t0:.0f} s", flush=True)
    return rows


def summary(rows: list[dict], meta: dict) -> str:
    lines = [f"mhc_pre at T = {T}: one pass (eighth, ninth) against two (direct / graph ms)"]
    times = {(r["impl"], r["H"]): r for r in rows if "ms" in r}
    for (impl, H), r in sorted(times.items(), key=lambda kv: (kv[0][1], DESIGNS.index(kv[0][0]))):
        two = times[("two-pass", H)]
        lines.append(f"H={H} {impl:9s} {r['ms']:.4f} / {r['graph_ms']:.4f} ms "
                     f"({r['ms'] / two['ms']:.2f}x two-pass)")
    for r in rows:
        if "stages" in r:
            parts = ", ".join(f"{k} {v['us']:.1f}" for k, v in r["stages"].items())
            lines.append(f"H={r['H']} ninth stages (median us): {parts}")
    return "\n".join(lines)
