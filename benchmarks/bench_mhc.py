"""mHC on the GPU: Triton mhc_pre / mhc_pre_from_mixes / mhc_post against the float32 torch
reference (eager, and torch.compile of it), T in {1, 128, 1024, 8192}, H in {4096, 7168}.

Stages: (1) direct calls of the kernels and the eager peer at every shape; (2) torch.compile of
the reference; (3) where mhc_pre's time goes at T = 8192; (4) small T with the host out of the
way: every op captured in a CUDA graph and replayed (rows with "timing": "cuda_graph"), and the
kernels called through torch.compile(mode="reduce-overhead"), which captures graphs itself
(impl "triton, reduce-overhead"); (5) the backward at T = 8192, H = 7168: the custom ops'
against eager autograd of the float32 torch reference (op "... backward").

Napkin math, bytes each op must move per token (bf16 = 2 B, fp32 = 4 B), minimal traffic:
  mhc_pre_from_mixes: read residual 4H*2 + dot_mix 24*4*S + sqrsum 4*S, write layer_input 2H
                      + post 4*4 + comb 16*4                     = 10H + 100 S + 80
  mhc_post:           read x 2H + residual 8H + post/comb 80, write 8H = 18H + 80
  mhc_pre (whole):    read residual 8H once, write layer_input 2H + post/comb 80 = 10H + 80
                      (fn, 24 x 4H fp32, is read once per run and stays in L2: not counted)
FLOPs are negligible (2 * 24 * 4H per token for the projection: 0.1 FLOP/byte).
"""

from __future__ import annotations

import time

import triton
import triton.language as tl

from benchmarks._harness import bench_ms, graph_ms
from kernelnotes.mhc.figures import SPLIT_ONCE  # the label of mhc_pre given split_fn(fn)
from kernelnotes.mhc.reference import bytes_per_token

DEVICE = "cuda"
T_ALL = (1, 128, 1024, 8192)
H_ALL = (4096, 7168)
T_QUICK, H_QUICK = (1, 8192), (7168,)
COMPILE_BUDGET_S = 200.0  # start no compiled peer after this many seconds of stage 2
T_SMALL, T_SMALL_QUICK = (1, 128, 1024), (1,)  # stage 4
REDUCE_OVERHEAD = "triton, reduce-overhead"  # the kernels inside torch.compile's CUDA graphs


def make_inputs(T: int, H: int):
    """residual, fn, scale, base, dot_mix, sqrsum, layer_out, post, comb for one shape."""
    import torch

    g = torch.Generator(device=DEVICE).manual_seed(T + H)
    K = 4 * H
    residual = torch.randn(T, 4, H, device=DEVICE, generator=g).bfloat16()
    fn = torch.randn(24, K, device=DEVICE, generator=g) / K**0.5
    scale = 1 + 0.1 * torch.randn(3, device=DEVICE, generator=g)
    base = 0.3 * torch.randn(24, device=DEVICE, generator=g)
    x = residual.flatten(1).float()
    dot_mix = (x @ fn.T).contiguous()  # [T, 24]: S = 1
    sqrsum = x.square().sum(-1).contiguous()  # [T]
    layer_out = torch.randn(T, H, device=DEVICE, generator=g).bfloat16()
    post = 2 * torch.rand(T, 4, device=DEVICE, generator=g)
    comb = torch.rand(T, 4, 4, device=DEVICE, generator=g)
    comb = comb / comb.sum(1, keepdim=True)
    return residual, fn, scale, base, dot_mix, sqrsum, layer_out, post, comb


def calls(impls: dict, T: int, H: int):
    """{op: {impl: zero-argument callable}} for one shape."""
    residual, fn, scale, base, dot_mix, sqrsum, layer_out, post, comb = make_inputs(T, H)
    out = {}
    for name, (pre, from_mixes, post_fn) in impls.items():
        out.setdefault("mhc_pre", {})[name] = lambda f=pre: f(residual, fn, scale, base)
        out.setdefault("mhc_pre_from_mixes", {})[name] = (
            lambda f=from_mixes, n=name: f(dot_mix if n == "triton" else dot_mix[None],
                                          sqrsum if n == "triton" else sqrsum[None],
                                          residual, scale, base))
        out.setdefault("mhc_post", {})[name] = lambda f=post_fn: f(layer_out, residual, post, comb)
    if "triton" in impls:  # the same kernels given fn split once, as a model does at load time
        from kernelnotes.mhc.kernel import split_fn

        parts, pre = split_fn(fn), impls["triton"][0]
        out["mhc_pre"][SPLIT_ONCE] = lambda: pre(residual, parts, scale, base)
    return out


def _row(op, impl, T, H, ms):
    nbytes = T * bytes_per_token(op, H)
    p50, p20, p80 = ms
    return {"op": op, "impl": impl, "T": T, "H": H, "ms": p50, "ms_p20": p20, "ms_p80": p80,
            "bytes": nbytes, "gbs": nbytes / (p50 * 1e-3) / 1e9}


def _phases(T: int, H: int, config) -> dict:
    """mhc_pre's three launches timed one by one, the whole call, and a pure read of the
    residual: what the projection, which reads it once and writes 100 bytes a token, could take
    at best. Also the whole call's error against the eager reference (the GPU path, checked)."""
    import torch

    from kernelnotes._testing import rel_err
    from kernelnotes.mhc import kernel
    from kernelnotes.mhc.torch_reference import mhc_pre_torch

    residual, fn, scale, base = make_inputs(T, H)[:4]
    errs = [rel_err(a, b) for a, b in zip(kernel.mhc_pre(residual, fn, scale, base, config=config),
                                          mhc_pre_torch(residual, fn, scale, base), strict=True)]
    w = kernel.split_fn(fn)
    project_cfg = None if config is None else config["project"]
    dot_mix, sqrsum = kernel._project(residual, w, None, project_cfg)
    fuse_cfg = None if config is None else config["fuse"]
    k = 4 * H
    partial = torch.empty(4 * T, device=DEVICE)
    fns = {
        "split": lambda: kernel.split_fn(fn),
        "project": lambda: kernel._project(residual, w, None, project_cfg),
        "fuse": lambda: kernel._fuse(dot_mix, sqrsum, residual, scale, base, 1e-6, 1e-6, 1e-6,
                                     2.0, 20, fuse_cfg, reverse=True),
        "whole": lambda: kernel.mhc_pre(residual, fn, scale, base, config=config),
        "whole_split_once": lambda: kernel.mhc_pre(residual, w, scale, base, config=config),
        "read": lambda: read_sq[(4, triton.cdiv(T, 8))](residual, partial, T, k, k // 4,
                                                          BT=8, BK=1024, num_warps=4),
    }
    # GPU time from CUDA graphs: a direct call of the split (a few microseconds of work) would
    # time the host's launch instead
    return {"op": "mhc_pre phases", "impl": "triton", "T": T, "H": H,
            **{f"{key}_ms": graph_ms(f, replays=20) for key, f in fns.items()},
            "relerr_vs_eager": [round(e, 6) for e in errs],
            "splits": dot_mix.shape[0], "bytes_read": T * 8 * H,
            "bytes_fuse": T * bytes_per_token("mhc_pre_from_mixes", H, S=dot_mix.shape[0])}


@triton.jit
def read_sq(x_ptr, out_ptr, T, K, K_SPLIT, BT: tl.constexpr, BK: tl.constexpr):
    """sum of x^2 over [BT tokens, K_SPLIT columns] of x [T, K] bf16: a read and nothing else."""
    offs_t = (tl.program_id(1) * BT + tl.arange(0, BT)).to(tl.int64)
    k_lo = tl.program_id(0) * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = tl.zeros((BT, BK), tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=3):
        offs_k = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + offs_t[:, None] * K + offs_k[None, :],
                    mask=(offs_t < T)[:, None] & (offs_k < k_hi)[None, :], other=0.0)
        acc += x.to(tl.float32) * x.to(tl.float32)
    tl.store(out_ptr + tl.program_id(0) * T + offs_t, tl.sum(acc, 1), mask=offs_t < T)


def run(quick: bool) -> list[dict]:
    import functools

    import torch

    from kernelnotes.mhc import kernel
    from kernelnotes.mhc.torch_reference import (
        mhc_post_torch,
        mhc_pre_from_mixes_torch,
        mhc_pre_torch,
    )

    t0 = time.time()
    shapes = [(T, H) for H in (H_QUICK if quick else H_ALL) for T in (T_QUICK if quick else T_ALL)]
    timing = {"warmup_ms": 10, "rep_ms": 40} if quick else {"warmup_ms": 20, "rep_ms": 60}
    if quick:  # a smoke run: fixed tiles, no autotuning, no torch.compile
        stream = {"BLOCK_T": 2, "BLOCK_H": 1024, "num_warps": 4}
        pre_cfg = {"project": {"BLOCK_T": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
                   "fuse": stream}
        triton_impl = (functools.partial(kernel.mhc_pre, config=pre_cfg),
                       functools.partial(kernel.mhc_pre_from_mixes, config=stream),
                       functools.partial(kernel.mhc_post, config=stream))
    else:
        pre_cfg = None
        triton_impl = (kernel.mhc_pre, kernel.mhc_pre_from_mixes, kernel.mhc_post)
    eager_impl = (mhc_pre_torch, mhc_pre_from_mixes_torch, mhc_post_torch)
    rows = []
    # 1. this project's kernels and the eager peer, every shape (autotuning happens here)
    for T, H in shapes:
        by_op = calls({"triton": triton_impl, "eager": eager_impl}, T, H)
        for op, by_impl in by_op.items():
            for impl, fn in by_impl.items():
                rows.append(_row(op, impl, T, H, bench_ms(fn, **timing)))
        del by_op
        torch.cuda.empty_cache()
    print(f"mhc: triton and eager timed in {time.time() - t0:.0f} s", flush=True)
    # 2. torch.compile of the same reference while the time budget lasts (compiles are slow):
    #    dynamic shapes (one graph for T > 1, one for T = 1), mhc_pre first, small T first
    budget, t2 = COMPILE_BUDGET_S, time.time()  # stage 1's own length varies with the host
    ops = () if quick else ("mhc_pre", "mhc_pre_from_mixes", "mhc_post")  # quick: < 30 s
    compiled = tuple(torch.compile(f, dynamic=True) for f in eager_impl)
    for op in ops:
        for T, H in sorted(shapes):
            if time.time() - t2 > budget:
                rows.append({"op": op, "impl": "compiled", "T": T, "H": H, "ms": None,
                             "skipped": f"compile budget of {budget:.0f} s spent"})
                continue
            fn = calls({"compiled": compiled}, T, H)[op]["compiled"]
            try:
                rows.append(_row(op, "compiled", T, H, bench_ms(fn, **timing)))
            except Exception as e:  # noqa: BLE001  a peer that fails to compile: reported
                rows.append({"op": op, "impl": "compiled", "T": T, "H": H, "ms": None,
                             "skipped": f"{type(e).__name__}: {str(e)[:200]}"})
            del fn
            torch.cuda.empty_cache()
    print(f"mhc: torch.compile peers done at {time.time() - t0:.0f} s", flush=True)
    # 3. where mhc_pre's time goes, at T = 8192
    rows += [_phases(T, H, pre_cfg) for T, H in shapes if T == 8192]
    # 4. small T: GPU time from CUDA graphs, and the kernels under torch.compile's graphs
    rows += _small_t(quick, triton_impl, eager_impl, compiled)
    print(f"mhc: small-T graphs done at {time.time() - t0:.0f} s", flush=True)
    # 5. the backward at the size
    rows += _backward(quick)
    return rows


def _small_t(quick: bool, triton_impl, eager_impl, compiled) -> list[dict]:
    """Each op at small T as a caller without graphs pays for it (the direct-call rows of stage
    1), as the GPU spends it (one call captured in a CUDA graph and replayed), and through
    torch.compile(mode="reduce-overhead"), which records the kernels in CUDA graphs itself."""
    import torch

    rows, budget, t0 = [], COMPILE_BUDGET_S / 2, time.time()
    impls = {"triton": triton_impl, "eager": eager_impl}
    if not quick:
        impls["compiled"] = compiled
    for H in H_QUICK if quick else H_ALL:
        for T in T_SMALL_QUICK if quick else T_SMALL:
            for op, by_impl in calls(impls, T, H).items():
                for impl, fn in by_impl.items():
                    row = {"op": op, "impl": impl, "T": T, "H": H, "timing": "cuda_graph"}
                    if impl == "compiled" and time.time() - t0 > budget:
                        row["skipped"] = f"compile budget of {budget:.0f} s spent"
                    else:
                        try:
                            row["graph_ms"] = graph_ms(fn)
                        except Exception as e:  # noqa: BLE001  a peer that cannot be captured
                            row["skipped"] = f"{type(e).__name__}: {str(e)[:200]}"
                    rows.append(row)
            # the custom ops under torch.compile's CUDA graphs, timed as direct calls
            reduce = tuple(torch.compile(f, mode="reduce-overhead", fullgraph=True)
                           for f in triton_impl)
            for op, fn in calls({REDUCE_OVERHEAD: reduce}, T, H).items():
                fn = fn[REDUCE_OVERHEAD]
                row = {"op": op, "impl": REDUCE_OVERHEAD, "T": T, "H": H}
                try:
                    for _ in range(3):  # warm-up: compile, record the graph
                        fn()
                    row.update(_row(op, REDUCE_OVERHEAD, T, H, bench_ms(fn, warmup_ms=10,
                                                                      rep_ms=40)))
                except Exception as e:  # noqa: BLE001
                    row.update(ms=None, skipped=f"{type(e).__name__}: {str(e)[:200]}")
                rows.append(row)
            torch.cuda.empty_cache()
    return rows


def _backward(quick: bool) -> list[dict]:
    """The backward at T = 8192, H = 7168: alone (one graph built, then torch.autograd.grad with
    retain_graph, timed by do_bench), and forward + backward as a training step pays them. The
    custom ops' (Triton passes over the residual and over the 24 gates a token)
    against eager autograd of the float32 torch reference."""
    import torch

    from kernelnotes.mhc import mhc_post, mhc_pre
    from kernelnotes.mhc.torch_reference import mhc_post_torch, mhc_pre_torch

    T, H = (1024, 7168) if quick else (8192, 7168)
    residual, fn, scale, base, _, _, layer_out, post, comb = make_inputs(T, H)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    rows = []
    for op, impls in (("mhc_pre backward", {"triton": mhc_pre, "eager": mhc_pre_torch}),
                      ("mhc_post backward", {"triton": mhc_post, "eager": mhc_post_torch})):
        for impl, f in impls.items():
            if op == "mhc_pre backward":
                ins = [t.detach().clone().requires_grad_() for t in (residual, fn, scale, base)]
                outs = f(*ins)
            else:
                ins = [t.detach().clone().requires_grad_() for t in (layer_out, residual, post,
                                                                     comb)]
                outs = (f(*ins),)
            cots = [torch.randn(o.shape, device=DEVICE, generator=g).to(o.dtype) for o in outs]

            def backward(outs=outs, ins=ins, cots=cots):
                torch.autograd.grad(outs, ins, cots, retain_graph=True)

            def step(f=f, ins=ins, cots=cots, op=op):  # forward + backward: a training step
                outs = f(*ins)
                outs = outs if op == "mhc_pre backward" else (outs,)
                torch.autograd.grad(outs, ins, cots)

            timing = {"warmup_ms": 10 if quick else 25, "rep_ms": 40 if quick else 100}
            for name, fn_ in ((op, backward), (op.replace("backward", "forward+backward"), step)):
                p50, p20, p80 = bench_ms(fn_, **timing)
                rows.append({"op": name, "impl": impl, "T": T, "H": H, "ms": p50,
                             "ms_p20": p20, "ms_p80": p80})
            del outs, ins, cots
            torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict], meta: dict) -> str:
    copy = meta["copy_gbs"]
    ms = {(r["op"], r["impl"], r["T"], r["H"]): r["ms"] for r in rows
          if r.get("ms") and "timing" not in r}
    gbs = {(r["op"], r["impl"], r["T"], r["H"]): r["gbs"] for r in rows
           if r.get("ms") and "gbs" in r}
    lines = [f"mHC, copy ceiling {copy:.0f} GB/s"]
    for H in sorted({r["H"] for r in rows}):
        for op, target in (("mhc_pre_from_mixes", 90), ("mhc_post", 90), ("mhc_pre", 55)):
            g = gbs.get((op, "triton", 8192, H))
            if g is not None:
                lines.append(f"{op} T=8192 H={H}: {g:.0f} GB/s = {100 * g / copy:.1f}% of copy "
                             f"(target >= {target}%)")
        e, t = ms.get(("mhc_pre", "eager", 8192, H)), ms.get(("mhc_pre", "triton", 8192, H))
        if e and t:
            lines.append(f"mhc_pre T=8192 H={H}: {e / t:.1f}x the eager torch reference "
                         "(target >= 15x)")
        once = ms.get(("mhc_pre", SPLIT_ONCE, 8192, H))
        if e and once:
            lines.append(f"mhc_pre T=8192 H={H}, fn split once: {e / once:.1f}x eager, "
                         f"{100 * gbs[('mhc_pre', SPLIT_ONCE, 8192, H)] / copy:.1f}% of copy")
        for T in sorted({r["T"] for r in rows if r["T"] < 8192}):
            for op in ("mhc_pre", "mhc_pre_from_mixes", "mhc_post"):
                t, c = ms.get((op, "triton", T, H)), ms.get((op, "compiled", T, H))
                if t:
                    vs = (f", torch.compile {1e3 * c:.1f} us ({c / t:.2f}x; target >= 1x)"
                          if c else "")
                    lines.append(f"{op} T={T} H={H}: {1e3 * t:.1f} us{vs}")
            once = ms.get(("mhc_pre", SPLIT_ONCE, T, H))
            if once:
                lines.append(f"mhc_pre T={T} H={H}, fn split once: {1e3 * once:.1f} us")
    for op in ("mhc_pre backward", "mhc_post backward", "mhc_pre forward+backward",
               "mhc_post forward+backward"):
        ours, eager = (next((r for r in rows if r["op"] == op and r["impl"] == impl), None)
                       for impl in ("triton", "eager"))
        if ours and eager:
            lines.append(f"{op} T={ours['T']} H={ours['H']}: {1e3 * ours['ms']:.1f} us, eager "
                         f"autograd {1e3 * eager['ms']:.1f} us ({eager['ms'] / ours['ms']:.2f}x; "
                         "target >= 1x)")
    for r in rows:
        direct = ms.get((r["op"], "triton", r["T"], r["H"]))
        if r["impl"] == REDUCE_OVERHEAD and r.get("ms") and direct:
            lines.append(f"{r['op']} T={r['T']} H={r['H']}: direct {1e3 * direct:.1f} us, "
                         f"reduce-overhead {1e3 * r['ms']:.1f} us")
    for r in rows:
        if r["op"] == "mhc_pre phases":
            lines.append(f"mhc_pre T={r['T']} H={r['H']} phases (us): " + ", ".join(
                f"{k[:-3]} {1e3 * v:.1f}" for k, v in r.items() if k.endswith("_ms")))
    return "\n".join(lines)
