"""The forward designs of lab/attention beside the product's kernel, cuDNN and FlashAttention-2.

Issue 56's points: bf16, H = 16 heads, B = 65536 / N, D in {64, 128}, N in {1k, 4k, 16k}, causal
and not; forward FLOPs 4 B H N^2 D, halved when causal. Implementations:
  - ``triton_fa2``: ``kernelnotes.attention.flash_attention`` (the product, autotuned);
  - ``ws_tl:<config>``: lab/attention/ws_tl.py, Triton's automatic warp specialisation;
  - ``fa3_gluon:<i>``: ``kernelnotes.attention.hopper.fa3_forward`` with ``CONFIGS[i]``, the
    producer warp and ping-pong warpgroups (design B of NOTES.md, now the product's D = 128
    forward on Hopper; ``triton_fa2`` runs it too where it applies);
  - ``fa3_persistent:<i>``: lab/attention/fa3_persistent.py with its ``CONFIGS[i]``, design B
    made persistent (design C: min(#SMs, #tiles) programs looping over tiles);
  - ``sdpa_cudnn`` and ``sdpa_flash``: torch SDPA's cuDNN and FlashAttention-2 backends.
Each design and config is first run once in a child process with a time limit (a kernel whose
barriers deadlock would otherwise hang the run) and checked against a float64 reference at
N = 1024: its relative error must be within 2x SDPA's own bf16 error, or it is not timed.
Then the backward part: every design of ``_bwd_designs()`` (``bwd_gluon``:
lab/attention/bwd_gluon.py, design D, a FlashAttention-3-style Hopper backward) is probed the
same way in a child process against float64 gradients at N = 1024 (each of dq, dk, dv within 2x
the error of PyTorch's math attention run in bf16, plus u/2 with u = 2^-8) and, if it passes,
timed at the same points beside the product's backward (``triton_fa2``: ``torch.autograd.grad``
through ``flash_attention``, what the product benchmark times; ``flash_attn_bwd``: the product's
backward kernels called directly) and cuDNN's (``sdpa_cudnn``: autograd through SDPA's cuDNN
backend); rows with ``"pass": "bwd"``, FLOPs 10 B H N^2 D (halved when causal).
Write ``lab/attention/results/designs.json`` with ``python -m benchmarks --lab attention designs``;
``LAB_DESIGNS=fa3_persistent,bwd_gluon`` (comma-separated name prefixes) limits the run to those
designs beside the peers, to fit a short GPU lease. Nothing runs at import.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

H, TOKENS = 16, 65536
SIZES = {True: ((128,), (4096,)), False: ((64, 128), (1024, 4096, 16384))}
TIMING = dict(rounds=3, warmup_ms=25, rep_ms=70)
PROBE_TIMEOUT_S = 120
# designs not probed again: each hung probe costs PROBE_TIMEOUT_S of a GPU run
KNOWN_HANGS = {"ws_tl": "hung on the H200 in every configuration (NOTES.md, design A)"}
ROOT = Path(__file__).resolve().parents[2]


def _wanted(name: str) -> bool:
    """Whether LAB_DESIGNS (comma-separated prefixes; unset: all) selects design ``name``."""
    prefixes = [p for p in os.environ.get("LAB_DESIGNS", "").split(",") if p]
    return not prefixes or any(name.startswith(p) for p in prefixes)


def _designs() -> dict:
    """{name: fn(q, k, v, causal) -> o} of every lab design and config that imports."""
    out = {}
    from lab.attention import ws_tl

    for c in ws_tl.CONFIGS:
        out[f"ws_tl:{c}"] = functools.partial(_first, ws_tl.attention_ws, config=c)
    from kernelnotes.attention import hopper

    for c, cfg in enumerate(hopper.CONFIGS):
        out[f"fa3_gluon:{c}"] = functools.partial(_first, hopper.fa3_forward, config=cfg)
    from lab.attention import fa3_persistent

    for c, cfg in enumerate(fa3_persistent.CONFIGS):
        out[f"fa3_persistent:{c}"] = functools.partial(
            _first, fa3_persistent.fa3_persistent_forward, config=cfg)
    return out


def _first(fn, q, k, v, causal, **kw):
    """The output of a design that returns (o, lse)."""
    return fn(q, k, v, causal, **kw)[0]


def _peers(causal: bool) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernelnotes.attention import flash_attention

    def sdpa(backend):
        def fn(q, k, v, causal=causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn

    return {"triton_fa2": lambda q, k, v, causal=causal: flash_attention(q, k, v,
                                                                          is_causal=causal),
            "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
            "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION)}


def _rel_err(o, ref) -> float:
    return float((o.double() - ref).norm() / ref.norm())


def probe(name: str) -> dict:
    """Run one implementation at every D and causal on N = 1024 (B = 2): its error against a
    float64 reference beside SDPA flash's bf16 error. Runs in the child process."""
    import torch

    fns = _designs()
    out = {"impl": name, "checks": []}
    for D in (64, 128):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(1)
            q, k, v = (torch.randn(2, H, 1024, D, device="cuda", generator=g).bfloat16()
                       for _ in range(3))
            s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
            if causal:
                s = s.masked_fill(torch.ones(1024, 1024, dtype=torch.bool,
                                             device="cuda").triu(1), -math.inf)
            ref = torch.softmax(s, -1) @ v.double()
            o = fns[name](q, k, v, causal)
            err = _rel_err(o, ref)
            base = _rel_err(_peers(causal)["sdpa_flash"](q, k, v), ref)
            out["checks"].append({"D": D, "causal": causal, "rel_err": err, "sdpa_rel_err": base,
                                  "ok": bool(math.isfinite(err) and err <= 2 * base)})
    out["ok"] = all(c["ok"] for c in out["checks"])
    return out


def _probe_child(name: str, probe_fn: str = "probe") -> dict:
    """Run ``probe_fn(name)`` (probe or probe_bwd) in a child process with a time limit: a kernel
    whose barriers deadlock returns an error row instead of hanging the run."""
    code = (f"import json, sys; from lab.attention.bench_designs import {probe_fn}; "
            f"print(json.dumps({probe_fn}({name!r})))")
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"impl": name, "ok": False, "error": f"no result in {PROBE_TIMEOUT_S} s (hang?)"}
    if proc.returncode != 0:
        return {"impl": name, "ok": False, "error": proc.stderr.strip()[-600:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _bwd_designs() -> dict:
    """{name: fn(do, q, k, v, o, lse, causal) -> (dq, dk, dv)} of every lab backward design."""
    from lab.attention import bwd_gluon

    return {"bwd_gluon": lambda do, q, k, v, o, lse, causal: bwd_gluon.flash_bwd_hopper(
        do, q, k, v, o, lse, causal=causal)}


U_BF16 = 2.0 ** -8  # bf16's unit roundoff is u / 2


def _math_grads(q, k, v, do, causal):
    """(dq, dk, dv) of PyTorch-style math attention in q's dtype (float64 for the reference)."""
    import torch

    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1),
                          -math.inf)
    o = torch.softmax(s, -1) @ v
    return torch.autograd.grad(o, (q, k, v), do)


def probe_bwd(name: str) -> dict:
    """Run one backward design at every D and causal on N = 1024 (B = 2): each gradient's error
    against float64 beside math attention's bf16 error. Runs in the child process."""
    import torch

    from kernelnotes.attention import flash_attn_fwd

    fn = _bwd_designs()[name]
    out = {"impl": name, "checks": []}
    for D in (64, 128):
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(2)
            q, k, v, do = (torch.randn(2, H, 1024, D, device="cuda", generator=g).bfloat16()
                           for _ in range(4))
            o, lse = flash_attn_fwd(q, k, v, causal=causal)
            ref = _math_grads(q.double(), k.double(), v.double(), do.double(), causal)
            base = _math_grads(q, k, v, do, causal)
            got = fn(do, q, k, v, o, lse, causal)
            torch.cuda.synchronize()
            for gname, x, b, r in zip(("dq", "dk", "dv"), got, base, ref, strict=True):
                err, berr = _rel_err(x, r), _rel_err(b, r)
                out["checks"].append({"D": D, "causal": causal, "grad": gname, "rel_err": err,
                                      "math_bf16_rel_err": berr,
                                      "ok": bool(math.isfinite(err)
                                                 and err <= 2 * berr + U_BF16 / 2)})
    out["ok"] = all(c["ok"] for c in out["checks"])
    return out


def _bwd_peers(q, k, v, do, causal: bool) -> tuple[dict, tuple]:
    """({name: fn() -> grads} of the product's and cuDNN's backward, (o, lse) of the product's
    forward for the designs); each forward runs once here, outside the timing, with its graph
    kept for repeated autograd.grad calls."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernelnotes.attention import flash_attention, flash_attn_bwd, flash_attn_fwd

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    o_prod = flash_attention(qg, kg, vg, is_causal=causal)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o_cudnn = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    with torch.no_grad():
        o, lse = flash_attn_fwd(q, k, v, causal=causal)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(o_cudnn, (qg, kg, vg), do, retain_graph=True)

    return {"triton_fa2": lambda: torch.autograd.grad(o_prod, (qg, kg, vg), do,
                                                      retain_graph=True),
            "flash_attn_bwd": lambda: flash_attn_bwd(do, q, k, v, o, lse, causal=causal),
            "sdpa_cudnn": cudnn}, (o, lse)


def _timed_rows(timed: dict, pass_: str, D: int, N: int, B: int, causal: bool,
                flops: float) -> list[dict]:
    """A result row per implementation from bench_interleaved's (p50, p20, p80) timings, with
    its TFLOP/s and its speed against cuDNN's; prints the point's ratios."""
    cudnn = timed["sdpa_cudnn"][0]
    print(f"{'backward ' if pass_ == 'bwd' else ''}D={D} N={N} causal={causal}: " + ", ".join(
        f"{n} {cudnn / t[0]:.3f}" for n, t in timed.items()), flush=True)
    return [{"impl": name, "pass": pass_, "D": D, "N": N, "B": B, "H": H, "causal": causal,
             "dtype": "bfloat16", "ms": p50, "ms_p20": p20, "ms_p80": p80,
             "tflops": flops / (p50 * 1e-3) / 1e12, "x_cudnn": cudnn / p50}
            for name, (p50, p20, p80) in timed.items()]


def run_bwd(quick: bool) -> list[dict]:
    """The backward part of run(): probe each backward design, then time the ones that pass."""
    import torch

    from benchmarks._harness import bench_interleaved

    rows, usable = [], []
    designs = _bwd_designs()
    for name in filter(_wanted, designs):
        result = _probe_child(name, "probe_bwd")
        rows.append(dict(result, **{"pass": "check_bwd"}))
        ratios = [round(c["rel_err"] / c["math_bf16_rel_err"], 2)
                  for c in result.get("checks", [])]
        print(f"check (backward) {name}: {'ok' if result['ok'] else 'FAILED'} "
              f"{result.get('error', '') or ratios}", flush=True)
        if result["ok"]:
            usable.append(name)
    Ds, Ns = SIZES[quick]
    for D in Ds:
        for N in Ns:
            B = TOKENS // N
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16,
                                           generator=g) for _ in range(4))
                fns, (o, lse) = _bwd_peers(q, k, v, do, causal)
                fns.update({name: functools.partial(designs[name], do, q, k, v, o, lse, causal)
                            for name in usable})
                for fn in fns.values():  # compile and autotune outside the timing
                    fn()
                timed = bench_interleaved(fns, **TIMING)
                flops = 10 * B * H * N * N * D * (0.5 if causal else 1.0)
                rows += _timed_rows(timed, "bwd", D, N, B, causal, flops)
                del q, k, v, do, o, lse, fns
                torch.cuda.empty_cache()
    return rows


def run(quick: bool) -> list[dict]:
    import time

    import torch

    from benchmarks._harness import bench_interleaved

    t0 = time.perf_counter()
    rows, usable = [], []
    for name in filter(_wanted, _designs()):
        if name.split(":")[0] in KNOWN_HANGS:
            rows.append({"impl": name, "pass": "check", "ok": False,
                         "skipped": KNOWN_HANGS[name.split(":")[0]]})
            print(f"check {name}: skipped, {KNOWN_HANGS[name.split(':')[0]]}", flush=True)
            continue
        result = _probe_child(name)
        rows.append(dict(result, **{"pass": "check"}))
        ratios = [round(c["rel_err"] / c["sdpa_rel_err"], 2) for c in result.get("checks", [])]
        print(f"check {name}: {'ok' if result['ok'] else 'FAILED'} "
              f"{result.get('error', '') or ratios}", flush=True)
        if result["ok"]:
            usable.append(name)
    designs = _designs()
    Ds, Ns = SIZES[quick]
    for D in Ds:
        for N in Ns:
            B = TOKENS // N
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16,
                                       generator=g) for _ in range(3))
                fns = {name: functools.partial(fn, q, k, v) for name, fn in _peers(causal).items()}
                fns.update({name: functools.partial(designs[name], q, k, v, causal)
                            for name in usable})
                with torch.no_grad():
                    for fn in fns.values():  # compile and autotune outside the timing
                        fn()
                    timed = bench_interleaved(fns, **TIMING)
                flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                rows += _timed_rows(timed, "fwd", D, N, B, causal, flops)
                del q, k, v, fns
                torch.cuda.empty_cache()
    rows.extend(run_bwd(quick))
    rows.append({"impl": "all", "pass": "total", "elapsed_s": round(time.perf_counter() - t0, 1)})
    return rows
