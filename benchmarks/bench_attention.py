"""FlashAttention-2 on the GPU: this project's Triton kernel beside torch SDPA's flash and cuDNN
backends and naive (materialized) attention, forward and backward, bf16.

Shapes (issue 3): H = 16 heads, batch B = 65536 / N, D in {64, 128}, N in {1k, 4k, 16k}, causal
and not. FLOPs (the FlashAttention convention): forward 4 B H N^2 D (two matmuls of 2 N^2 D each),
halved when causal; backward 2.5x the forward (five matmuls instead of two; recomputation of S is
not counted). Naive attention materializes S and P: at N = 16k that is B H N^2 * 2 bytes = 34 GB
per matrix, so it is timed only up to N = 4k.
"""

from __future__ import annotations

import functools
import math

from benchmarks._harness import bench_interleaved

H = 16
TOKENS = 65536
DTYPE = "bfloat16"
NAIVE_MAX_N = 4096
SIZES = {True: ((128,), (4096,)), False: ((64, 128), (1024, 4096, 16384))}  # quick: (Ds, Ns)
DEVICE = "cuda"
# every implementation of a point in 3 interleaved rounds (benchmarks._harness.bench_interleaved);
# the whole run must fit in 3 minutes with tuning
TIMING = dict(rounds=3, warmup_ms=25, rep_ms=70)


def flops(B, Hq, N, D, causal, pass_):
    f = 4 * B * Hq * N * N * D * (0.5 if causal else 1.0)
    return f * (2.5 if pass_ == "bwd" else 1.0)


def _naive(q, k, v, causal):
    import torch

    s = (q * (1 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)  # S, materialized [B, H, N, N]
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    return torch.softmax(s, dim=-1) @ v  # P, materialized


def _providers(causal, quick):
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernelnotes.attention import kernel

    fwd_cfg = bwd_cfg = None  # autotune
    if quick:  # fixed configs: no autotuning in the smoke run
        fwd_cfg = kernel._fwd_configs(128)[0]
        bwd_cfg = triton.Config(
            {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64},
            num_warps=8, num_stages=2)

    def ours(q, k, v):
        return kernel.flash_attention(q, k, v, is_causal=causal, fwd_config=fwd_cfg,
                                      bwd_config=bwd_cfg)

    def ours_atomic(q, k, v):  # same forward; the fused backward that adds dQ with atomics
        return kernel.flash_attention(q, k, v, is_causal=causal, deterministic=False,
                                      fwd_config=fwd_cfg, bwd_config=bwd_cfg)

    def sdpa(backend):
        def f(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return f

    return {
        "triton_fa2": ours,
        "triton_fa2_atomic": ours_atomic,
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "naive": lambda q, k, v: _naive(q, k, v, causal),
    }


def run(quick: bool) -> list[dict]:
    import time

    import torch

    t0 = time.perf_counter()
    rows = []
    Ds, Ns = SIZES[quick]
    for D in Ds:
        for N in Ns:
            B = TOKENS // N
            for causal in (False, True):
                g = torch.Generator(device=DEVICE).manual_seed(0)
                q, k, v, do = (torch.randn(B, H, N, D, device=DEVICE, dtype=torch.bfloat16,
                                           generator=g) for _ in range(4))
                point = dict(D=D, N=N, B=B, H=H, causal=causal, dtype=DTYPE)
                timed, info = _setup(_providers(causal, quick), q, k, v, do, quick, rows, point, t0)
                for (impl, pass_), (p50, p20, p80) in bench_interleaved(timed, **TIMING).items():
                    rows.append(dict(info[impl], **{
                        "pass": pass_, "ms": p50, "ms_p20": p20, "ms_p80": p80,
                        "tflops": flops(B, H, N, D, causal, pass_) / (p50 * 1e-3) / 1e12}))
                for impl in info:
                    print(f"  {impl:10s} D={D} N={N} causal={causal}: " + ", ".join(
                        f"{r['pass']} {r.get('tflops', float('nan')):.0f}"
                        for r in rows if r["impl"] == impl and r["D"] == D and r["N"] == N
                        and r["causal"] == causal), flush=True)
                del q, k, v, do, timed
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
    rows.append({"impl": "all", "pass": "total", "elapsed_s": round(time.perf_counter() - t0, 1)})
    return rows


def _setup(provs, q, k, v, do, quick, rows, point, t0):
    """Run each provider once (forward checked against ours, backward tuned or compiled) and
    return the closures to time, {(impl, pass): fn}, with each impl's row fields. A provider
    that fails (a backend missing on this build) gets an error row instead."""
    import time

    import torch

    timed, info, ref_o = {}, {}, None
    for impl, fn in provs.items():
        if impl == "naive" and (point["N"] > NAIVE_MAX_N or quick):
            continue
        row = dict(impl=impl, **point, elapsed_s=round(time.perf_counter() - t0, 1))
        try:
            with torch.no_grad():
                o = fn(q, k, v)
            if ref_o is None:  # triton_fa2 comes first; peers are checked against it
                ref_o = o.float()
            row["max_abs_diff"] = float((o.float() - ref_o).abs().max())
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            if DEVICE == "cuda":  # memory a training forward allocates (o + saved)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            o = fn(*leaves)
            if DEVICE == "cuda":
                row["fwd_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            torch.autograd.grad(o, leaves, do, retain_graph=True)  # tune, compile
        except Exception as e:  # a peer backend missing on this build: say so
            rows.append(dict(row, **{"pass": "error", "error": f"{type(e).__name__}: {e}"[:300]}))
            continue
        if impl != "triton_fa2_atomic":  # its forward is triton_fa2's
            timed[impl, "fwd"] = functools.partial(_no_grad, fn, q, k, v)
        timed[impl, "bwd"] = functools.partial(torch.autograd.grad, o, leaves, do,
                                               retain_graph=True)
        info[impl] = row
    return timed, info


def _no_grad(fn, *args):
    import torch

    with torch.no_grad():
        return fn(*args)


def ratios(rows):
    """(D, N, causal, pass) -> {impl: TFLOP/s} for the rows that were timed."""
    out: dict = {}
    for r in rows:
        if "tflops" in r:
            out.setdefault((r["D"], r["N"], r["causal"], r["pass"]), {})[r["impl"]] = r["tflops"]
    return out


def summary(rows, meta) -> str:
    lines = [f"attention bf16 H={H} B*N={TOKENS} ({meta.get('gpu', '?')}; "
             f"copy {meta.get('copy_gbs')} GB/s)"]
    for (D, N, causal, pass_), t in sorted(ratios(rows).items()):
        for impl in ("triton_fa2", "triton_fa2_atomic"):
            if impl not in t:
                continue
            ours = t[impl]
            parts = [f"{impl} D={D} N={N} causal={causal} {pass_}: {ours:.0f} TFLOP/s"]
            for peer, target in (("sdpa_flash", 1.4 if pass_ == "fwd" else 1.2),
                                 ("sdpa_cudnn", 0.85 if pass_ == "fwd" else None)):
                if peer in t:
                    tgt = f" (target >= {target}x)" if target and N >= 4096 else ""
                    ok = "" if not tgt else (" OK" if ours / t[peer] >= target else " MISS")
                    parts.append(f"{ours / t[peer]:.2f}x {peer}{tgt}{ok}")
            lines.append("  " + ", ".join(parts))
    diffs: dict = {}
    for r in rows:
        if "max_abs_diff" in r and r["impl"] != "triton_fa2":
            diffs[r["impl"]] = max(diffs.get(r["impl"], 0.0), r["max_abs_diff"])
    if diffs:  # bf16 outputs of magnitude ~1: a few 1e-2 at most when everyone is right
        lines.append("  largest |o - o_triton_fa2| over all points: "
                     + ", ".join(f"{k} {v:.2g}" for k, v in sorted(diffs.items())))
    total = [r["elapsed_s"] for r in rows if r.get("pass") == "total"]
    if total:
        lines.append(f"  wall time of the run: {total[0]:.0f} s (budget: 120 s)")
    errors = [r for r in rows if r.get("pass") == "error"]
    lines += [f"  error: {r['impl']} D={r['D']} N={r['N']} causal={r['causal']}: {r['error']}"
              for r in errors]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit("run `python -m benchmarks attention`")
