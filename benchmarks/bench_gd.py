"""Fused optimizer steps against torch.optim (fused=True and foreach=True) on the H200.

Cases (issue 6):
* one parameter of 2^28 elements (quick: 2^24): Adam fp32, SGD with momentum fp32, and Adam
  with bf16 parameters (fp32 state), each kernel config of ``CONFIGS`` also timed on its own;
* a model-shaped list (a GPT-2-medium-like stack: 292 tensors, about 355M parameters;
  quick: 4 layers of width 512): Adam and SGD with momentum.

Bytes each step must move per parameter (napkin math; the effective GB/s below use these):
* Adam fp32: read p, g, m, v and write p, m, v: 7 x 4 = 28 B.
* SGD with momentum fp32: read p, g, b and write p, b: 5 x 4 = 20 B.
* Adam with bf16 p and g, fp32 m and v (ours): 2 + 2 + 4 + 4 read, 2 + 4 + 4 written = 22 B.
  torch.optim keeps bf16 state for bf16 parameters: read p, g, m, v and write p, m, v at 2 B
  each = 14 B, so its rows carry that byte count.
"""

from __future__ import annotations

import functools
import gc
import math
import time

import torch

from benchmarks._harness import bench_ms

BYTES = {("adam", torch.float32): 28, ("sgd", torch.float32): 20,
         ("adam", torch.bfloat16): 22, ("adam-torch", torch.bfloat16): 14}


def _model_shapes(layers: int, d: int, vocab: int, ctx: int) -> list[tuple[int, ...]]:
    """Embeddings, then per layer: LN, QKV, attention out, LN, MLP up and down (with biases)."""
    shapes = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,),
                   (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    return shapes + [(d,), (d,)]


def _setup(shapes, dtype):
    ps = [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
    for p in ps:
        p.grad = torch.randn_like(p)
    return ps


def _time(make_opt, shapes, dtype, quick):
    """Median, p20, p80 ms of one optimizer step (after the state exists), and the host's
    milliseconds per step() call: the launches are asynchronous, so a few steps in a row timed on
    the host clock measure the Python work before and around them (10 steps queue a few
    hundred launches at most, well inside the launch queue, so the host does not wait)."""
    ps = _setup(shapes, dtype)
    opt = make_opt(ps)
    opt.step()  # creates the state (and compiles or tunes)
    opt.step()  # our optimizers keep their checked plan from the second step on
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        opt.step()
    host_ms = (time.perf_counter() - t0) * 1e3 / 10
    torch.cuda.synchronize()
    ms = bench_ms(opt.step, warmup_ms=10, rep_ms=50) if quick else bench_ms(opt.step)
    del opt, ps
    gc.collect()
    torch.cuda.empty_cache()
    return ms, host_ms


def _row(case, impl, shapes, dtype, timed, bytes_per_param, config=""):
    n = sum(torch.Size(s).numel() for s in shapes)
    (p50, p20, p80), host_ms = timed
    return dict(case=case, impl=impl, config=config, dtype=str(dtype).removeprefix("torch."),
                n_params=n, n_tensors=len(shapes), bytes_per_param=bytes_per_param,
                ms_p50=p50, ms_p20=p20, ms_p80=p80, host_ms=host_ms,
                gbs=n * bytes_per_param / (p50 * 1e-3) / 1e9)


def run(quick: bool) -> list[dict]:
    from kernelnotes.gd import SGD, Adam, kernel

    rows: list[dict] = []
    big = [(1 << 24,)] if quick else [(1 << 28,)]
    model = (_model_shapes(4, 512, 50304, 1024) if quick
             else _model_shapes(24, 1024, 50304, 1024))
    adam_kw = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    sgd_kw = dict(lr=1e-4, momentum=0.9)
    cases = [
        ("adam", "one tensor", big, torch.float32, Adam, torch.optim.Adam, adam_kw),
        ("sgd_momentum", "one tensor", big, torch.float32, SGD, torch.optim.SGD, sgd_kw),
        ("adam", "one tensor", big, torch.bfloat16, Adam, torch.optim.Adam, adam_kw),
        ("adam", "model", model, torch.float32, Adam, torch.optim.Adam, adam_kw),
        ("sgd_momentum", "model", model, torch.float32, SGD, torch.optim.SGD, sgd_kw),
    ]
    for algo, shape_name, shapes, dtype, ours, theirs, kw in cases:
        case = f"{algo} {shape_name}"
        b = BYTES[("adam" if algo == "adam" else "sgd", dtype)]
        # config=None tunes on a proxy (a few compiles); the quick smoke run takes a fixed one
        fixed = kernel.CONFIGS[1] if quick else None
        ms = _time(functools.partial(ours, **kw, config=fixed), shapes, dtype, quick)
        tuned = next(iter(kernel._TUNED.values()), None) if len(kernel._TUNED) == 1 else fixed
        rows.append(_row(case, "kernelnotes", shapes, dtype, ms, b, _cfg_name(tuned)))
        if shape_name == "one tensor" and dtype == torch.float32 and not quick:
            for cfg in kernel.CONFIGS:  # every candidate, to see how much the choice matters
                ms = _time(functools.partial(ours, **kw, config=cfg), shapes, dtype, quick)
                rows.append(_row(case, "kernelnotes (fixed config)", shapes, dtype, ms, b,
                                 _cfg_name(cfg)))
        kernel._TUNED.clear()
        tb = BYTES[("adam-torch", dtype)] if (algo == "adam" and dtype == torch.bfloat16) else b
        for flag in ("fused", "foreach"):
            ms = _time(functools.partial(theirs, **kw, **{flag: True}), shapes, dtype, quick)
            rows.append(_row(case, f"torch {flag}=True", shapes, dtype, ms, tb))
    return rows


def _cfg_name(cfg) -> str:
    if cfg is None:
        return ""
    return f"BLOCK={cfg.kwargs['BLOCK']} ITERS={cfg.kwargs['ITERS']} warps={cfg.num_warps}"


def summary(rows: list[dict], meta: dict) -> str:
    """The issue's target ratios."""
    copy = meta["copy_gbs"]

    def pick(case, impl, dtype="float32"):
        return next((r for r in rows if r["case"] == case and r["impl"] == impl
                     and r["dtype"] == dtype), None)

    out = []
    for case, target in (("adam one tensor", 0.90), ("sgd_momentum one tensor", 0.90)):
        ours, fused, fe = (pick(case, i) for i in ("kernelnotes", "torch fused=True",
                                                     "torch foreach=True"))
        if ours:
            out.append(f"{case} fp32 ({ours['n_params']} params, "
                       f"{ours['bytes_per_param']} B each): "
                       f"{ours['gbs']:.0f} GB/s = {ours['gbs'] / copy:.1%} of copy {copy:.0f} GB/s "
                       f"(target >= {target:.0%}); torch fused {fused['gbs'] / copy:.1%}, "
                       f"foreach {fe['gbs'] / copy:.1%}; config {ours['config']}")
    ours = pick("adam one tensor", "kernelnotes", "bfloat16")
    if ours:
        out.append(f"adam one tensor bf16 params/fp32 state: {ours['gbs']:.0f} GB/s over 22 B = "
                   f"{ours['gbs'] / copy:.1%} of copy")
    for case in ("adam model", "sgd_momentum model"):
        ours, fused, fe = (pick(case, i) for i in ("kernelnotes", "torch fused=True",
                                                     "torch foreach=True"))
        if ours:
            out.append(f"{case} ({ours['n_tensors']} tensors, {ours['n_params']} params): "
                       f"{fused['ms_p50'] / ours['ms_p50']:.2f}x torch fused (target >= 1.0x), "
                       f"{fe['ms_p50'] / ours['ms_p50']:.2f}x torch foreach; "
                       f"{ours['ms_p50']:.3f} ms, {ours['gbs'] / copy:.1%} of copy; host time "
                       f"per step() {ours.get('host_ms', math.nan):.3f} ms (torch fused "
                       f"{fused.get('host_ms', math.nan):.3f})")
    return "\n".join(out)
