"""The ping-pong study (lab/ffn/pingpong.py) beside the product's fused layer and cuBLAS.

Same layer as benchmarks/bench_ffn.py: bf16 x [8192, 4096], W [16384, 4096], bias, so
2 M N K = 1.10e12 FLOPs a call. Two measurements:
  - interleaved rounds (A B C ..., medians; benchmarks._harness.bench_interleaved) of cuBLAS
    ``F.linear``, ``kernelnotes.ffn.linear_act`` and ``linear_act_pingpong``, each with the GELU
    and with the bias only: the time the GELU epilogue adds, exposed and hidden;
  - each of them run back to back for 3 s while nvidia-smi samples power and clock, in two passes
    in turn: the energy a call (ms x W), which is what a call costs when the board sits at its
    power limit.
Write ``lab/ffn/results/pingpong.json`` with ``python -m benchmarks --lab ffn pingpong``.
Nothing runs at import.
"""

from __future__ import annotations

import math

PASSES = 2
CUBLAS = "torch F.linear (cuBLAS, bias fused)"


def _tflops(ms: float, flops: float) -> float:
    return round(flops / (ms * 1e-3) / 1e12, 1)


def run(quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from benchmarks._harness import bench_interleaved, sustained
    from kernelnotes.ffn import linear_act
    from lab.ffn.pingpong import linear_act_pingpong

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    M, K, N = (2048, 1024, 4096) if quick else (8192, 4096, 16384)
    x = torch.randn(M, K, device=dev, dtype=dt)
    W = torch.randn(N, K, device=dev, dtype=dt) / math.sqrt(K)
    b = torch.randn(N, device=dev, dtype=dt)
    flops = 2 * M * N * K
    shape = dict(M=M, K=K, N=N)
    fns = {(CUBLAS, "none"): lambda: F.linear(x, W, b)}
    for act in ("none", "gelu"):
        fns["triton linear_act", act] = lambda act=act: linear_act(x, W, b, act)
        fns["gluon linear_act_pingpong", act] = lambda act=act: linear_act_pingpong(x, W, b, act)
    rows: list[dict] = []
    ref = F.gelu(F.linear(x.float(), W.float(), b.float()))
    timed = {}
    for key, fn in fns.items():
        row = dict(op="interleaved", impl=f"{key[0]} {key[1]}", activation=key[1], **shape)
        try:
            y = fn()  # compile / autotune outside the rounds
            if key[1] == "gelu":
                row["relerr_vs_fp32"] = float(f"{float((y.float() - ref).norm() / ref.norm()):.2e}")
            timed[key] = fn
        except Exception as e:  # noqa: BLE001 - not Hopper, or a Gluon without what it needs
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
    for key, (p50, p20, p80) in bench_interleaved(timed, rounds=5).items():
        row = next(r for r in rows if r["impl"] == f"{key[0]} {key[1]}")
        row.update(ms=round(p50, 4), ms_p20=round(p20, 4), ms_p80=round(p80, 4),
                   tflops=_tflops(p50, flops))
    if quick:
        return rows
    energy = {key: dict(op="sustained energy", impl=f"{key[0]} {key[1]}", activation=key[1],
                        passes=[], **shape) for key in timed}
    for _ in range(PASSES):
        for key, fn in timed.items():
            try:
                got = sustained(fn)
            except Exception as e:  # noqa: BLE001 - no nvidia-smi: say so
                energy[key]["skipped"] = f"{type(e).__name__}: {e}"[:400]
                continue
            energy[key]["passes"].append(
                {k: got[k] for k in ("ms", "power_w", "sm_mhz", "clock_reasons")})
    for row in energy.values():
        passes = row["passes"]
        if len(passes) == PASSES:
            ms = sum(p["ms"] for p in passes) / PASSES
            joules = [p["ms"] * p["power_w"] / 1e3 for p in passes]
            row.update(ms=round(ms, 4), tflops=_tflops(ms, flops),
                       joules=round(sum(joules) / PASSES, 4),
                       sm_mhz=sum(p["sm_mhz"] for p in passes) / PASSES)
        rows.append(row)
    return rows


def summary(rows: list[dict], meta: dict) -> str:
    lines = [f"ffn ping-pong study on {meta.get('gpu', '?')}:"]
    for r in rows:
        what = f"{r['op']:>16} | {r['impl']:<34}"
        if "ms" in r:
            lines.append(f"  {what} {r['ms']:8.3f} ms {r['tflops']:6.1f} TFLOP/s"
                         + (f" {r['joules']:.3f} J" if "joules" in r else ""))
        else:
            lines.append(f"  {what} {r.get('error') or r.get('skipped')}")
    return "\n".join(lines)
