"""Fused linear + bias + activation (forward) and the two-layer FFN (forward + backward) on the GPU.

Peers, timed in the same run (issue 7): cuBLAS ``F.linear`` alone, eager ``F.gelu(F.linear(...))``,
and for the FFN block eager autograd and ``torch.compile`` of the same function.

Napkin math (bf16, x [M, K] = [8192, 4096], W [N, K] = [16384, 4096]):
  forward FLOPs 2 M N K = 1.10e12; at the ~680 TFLOP/s cuBLAS reaches that is 1.6 ms, while the
  bytes it must move (x 64 MiB, W 128 MiB, y 256 MiB) take 0.11 ms at 4.2 TB/s: compute bound,
  so a fused activation is free only if the epilogue hides under the matmul.
  FFN block x [M, d] -> [M, h] -> [M, d] with d = 4096, h = 16384: forward 2 * 2 M h d = 2.2e12,
  backward (dX, dW of both layers) 2x that, so fwd + bwd = 12 M h d = 6.6e12 FLOPs.
Nothing runs at import.
"""

from __future__ import annotations

import math

TOPIC = "ffn"
ENERGY_PASSES = 2


def _rel_err(got, ref) -> float:
    got, ref = got.float(), ref.float()
    return float((got - ref).norm() / ref.norm())


def _timing(p50: float, p20: float, p80: float, flops: float) -> dict:
    """A row's timing fields: the quantiles in ms and the p50 rate in TFLOP/s."""
    return dict(ms=round(p50, 4), ms_p20=round(p20, 4), ms_p80=round(p80, 4),
                tflops=_tflops(p50, flops))


def _tflops(ms: float, flops: float) -> float:
    return round(flops / (ms * 1e-3) / 1e12, 1)


def _record(rows: list[dict], row: dict) -> None:
    rows.append(row)
    print({kk: v for kk, v in row.items() if kk not in ("K", "N")}, flush=True)


def _interleaved(rows: list[dict], entries: list, flops, rounds: int, **timing) -> None:
    """Time entries [(row, fn, check or None)] in interleaved rounds (A B C ..., A B C ...,
    medians; benchmarks._harness.bench_interleaved), after checking each check(fn()) into its row.
    Peers of one target share the rounds: cuBLAS's rate moved by 3% between H200 runs, and timed
    one after another a drift would fall on one row only. flops: a row's FLOPs, or a function of
    the row that gives them. timing: bench_interleaved's warmup_ms and rep_ms. A failure is
    recorded, not raised."""
    from benchmarks._harness import bench_interleaved

    timed = {}
    for i, (row, fn, check) in enumerate(entries):
        try:
            out = fn()  # compile / autotune outside the timed rounds
            if check is not None:
                row.update(check(out))
            timed[i] = fn
        except Exception as e:  # noqa: BLE001 - one GPU shot: keep the other rows
            row["error"] = f"{type(e).__name__}: {e}"[:400]
    for i, quantiles in bench_interleaved(timed, rounds=rounds, **timing).items():
        row = entries[i][0]
        row.update(_timing(*quantiles, flops(row) if callable(flops) else flops))
    for row, _, _ in entries:
        _record(rows, row)


def _with_config(config, fn, *args):
    """fn(*args) with every kernel on config (None: the ops' own choice)."""
    from kernelnotes.ffn import kernel as k

    with k.use_config(config):
        return fn(*args)


def run(quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F
    import triton

    from benchmarks import _harness
    from kernelnotes.ffn import kernel as k
    from kernelnotes.ffn.figures import CUBLAS, ENERGY, SUSTAINED, TRAINING

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    M, K, N = (2048, 1024, 4096) if quick else (8192, 4096, 16384)
    # quick: one fixed config (no autotuning); full: config=None, what a caller gets (on Hopper
    # at this size kernel.TMA_CONFIG; the row records it)
    cfg = k.MATMUL_CONFIGS[0] if quick else None
    # the TMA kernel on the first config, with and without the flattened (tile, k) pipeline. The
    # first is TMA_CONFIG, what config=None takes at the full size on Hopper: that row and the
    # default one time one kernel twice in the same rounds, so their gap is the run's noise
    first = k.MATMUL_CONFIGS[0]
    tma = {
        flat: triton.Config(
            {**first.kwargs, "TMA": True, "FLATTEN": flat},
            num_warps=first.num_warps,
            num_stages=first.num_stages,
        )
        for flat in (False, True)
    }
    shape = dict(M=M, K=K, N=N)
    rows: list[dict] = []

    # ---- fused forward: y = gelu(x W^T + b) ---------------------------------------------------
    x = torch.randn(M, K, device=dev, dtype=dt)
    W = torch.randn(N, K, device=dev, dtype=dt) / math.sqrt(K)
    b = torch.randn(N, device=dev, dtype=dt)
    flops = 2 * M * N * K
    y_ref = F.gelu(F.linear(x, W, b))

    def vs_eager(y):
        return {"relerr_vs_torch": float(f"{_rel_err(y, y_ref):.2e}")}

    rounds = 3 if quick else 5
    default = cfg if quick else k._default_config(x, W.t(), torch.empty(M, N, device=dev, dtype=dt))
    fwd = [
        (dict(op="forward", impl=CUBLAS, **shape),
         lambda: F.linear(x, W, b), None),
        (dict(op="forward", impl="torch eager F.gelu(F.linear)", **shape),
         lambda: F.gelu(F.linear(x, W, b)), None),
        (dict(op="forward", impl="triton linear_act gelu", config=str(default), **shape),
         lambda: k._linear_act_forward(x, W, b, "gelu", config=cfg)[0], vs_eager),
    ]
    for flat, c in tma.items():
        name = "triton linear_act gelu [TMA" + (", FLATTEN]" if flat else "]")
        fwd.append((dict(op="forward", impl=name, config=str(c), **shape),
                    lambda c=c: k._linear_act_forward(x, W, b, "gelu", config=c)[0], vs_eager))
    _interleaved(rows, fwd, flops, rounds)

    # Probes, timed in interleaved rounds so that clock drift falls on all alike. Rounds: the
    # same layer at M = 8192 (4096 output tiles of 128 x 256: 31.03 rounds of the persistent grid
    # on 132 SMs, a 32nd of 4 tiles) and M = 8448 (4224 tiles: exactly 32); if the 32nd round
    # cost a tile's time, ours would run ~3% faster per FLOP at 8448. Epilogue: our kernel with
    # no activation (bias only) at M = 8192, so the GELU's share of the time is measured, and
    # with the GELU but the output stored by pointers instead of TMA.
    if not quick:
        xs_by_m = {m: x if m == M else torch.randn(m, K, device=dev, dtype=dt) for m in (M, 8448)}

        def at(impl, m):
            return dict(op="probes (interleaved)", impl=impl, M=m, K=K, N=N)

        probe = []
        for m, xm in xs_by_m.items():
            probe.append((at(CUBLAS, m),
                          lambda xm=xm: F.linear(xm, W, b), None))
            probe.append((at("triton linear_act gelu", m),
                          lambda xm=xm: k._linear_act_forward(xm, W, b, "gelu")[0], None))
        probe.append((at("triton linear_act none", M),
                      lambda: k._linear_act_forward(x, W, b, "none")[0], None))
        # the default kernel with its output stored from registers by pointers, as before the
        # TMA store (kernel._store_tma): what the store path is worth, in the same rounds
        ptr_store = triton.Config({**default.kwargs, "TMA_STORE": False},
                                  num_warps=default.num_warps, num_stages=default.num_stages)
        probe.append((at("triton linear_act gelu [pointer store]", M),
                      lambda: k._linear_act_forward(x, W, b, "gelu", config=ptr_store)[0], None))
        _interleaved(rows, probe, lambda r: 2 * r["M"] * N * K, rounds=5)
        del xs_by_m, probe

        # The training layers of the FFN block, as FFNFunction runs them: the forward that keeps
        # Z, and the backward's dZ1 = (dY W2) * gelu'(Z1) with db1; the epilogue's Z and output
        # moved by TMA in half tiles (the default) or by pointers, and eager's matmul +
        # gelu_backward, in the same rounds; the two ways are timed sustained below as well.
        w2_t = torch.randn(K, N, device=dev, dtype=dt) / math.sqrt(K)
        dy_t = torch.randn(M, K, device=dev, dtype=dt)
        z_t = F.linear(x, W, b)
        db_t = torch.zeros(N, device=dev, dtype=torch.float32)

        def dz1(config):
            return k._matmul(dy_t, w2_t, torch.empty_like(z_t), z=z_t, db=db_t, act=2,
                             grad_act=True, config=config)

        training = [
            (dict(op=TRAINING, impl=impl, **shape), fn, None)
            for impl, fn in (
                (CUBLAS, lambda: F.linear(x, W, b)),
                ("triton linear_act gelu, store_z",
                 lambda: k._linear_act_forward(x, W, b, "gelu", store_z=True)),
                ("triton linear_act gelu, store_z [pointer store]",
                 lambda: k._linear_act_forward(x, W, b, "gelu", store_z=True, config=ptr_store)),
                ("torch dY @ W2 + aten.gelu_backward",
                 lambda: torch.ops.aten.gelu_backward(dy_t @ w2_t, z_t)),
                ("triton dZ1 (gelu' epilogue, db1)", lambda: dz1(default)),
                ("triton dZ1 (gelu' epilogue, db1) [pointer store]", lambda: dz1(ptr_store)),
            )
        ]
        _interleaved(rows, training, flops, rounds=5)

    # gated (SwiGLU), same FLOPs: W_gate_up [N, K] -> h [M, N/2]
    H = N // 2

    def eager_swiglu():
        z = F.linear(x, W)
        return F.silu(z[:, :H]) * z[:, H:]

    h_ref = eager_swiglu()
    _interleaved(rows, [
        (dict(op="swiglu forward", impl="torch eager silu(x Wg^T) * (x Wu^T)", **shape),
         eager_swiglu, None),
        (dict(op="swiglu forward", impl="triton linear_swiglu", **shape),
         lambda: k._linear_swiglu_forward(x, W)[0],
         lambda h: {"relerr_vs_torch": float(f"{_rel_err(h, h_ref):.2e}")}),
    ], flops, rounds)

    # ---- two-layer FFN block, forward + backward ----------------------------------------------
    d, h = K, N
    xs = torch.randn(M, d, device=dev, dtype=dt, requires_grad=True)
    w1 = (torch.randn(h, d, device=dev, dtype=dt) / math.sqrt(d)).requires_grad_()
    b1 = (torch.randn(h, device=dev, dtype=dt) / 10).requires_grad_()
    w2 = (torch.randn(d, h, device=dev, dtype=dt) / math.sqrt(h)).requires_grad_()
    b2 = (torch.randn(d, device=dev, dtype=dt) / 10).requires_grad_()
    params = (xs, w1, b1, w2, b2)
    dy = torch.randn(M, d, device=dev, dtype=dt)
    ffn_flops = 12 * M * h * d

    def eager(x_, w1_, b1_, w2_, b2_):
        return F.linear(F.gelu(F.linear(x_, w1_, b1_)), w2_, b2_)

    def step(f):
        return lambda: torch.autograd.grad(f(*params), params, dy)  # no .grad accumulation

    ref_grads = step(eager)()

    def vs_autograd(grads):
        errs = [float(f"{_rel_err(g, r):.2e}") for g, r in zip(grads, ref_grads, strict=True)]
        return {"relerr_grads_vs_eager": errs}

    ffn_shape = dict(M=M, K=d, N=h)
    block = [(dict(op="ffn fwd+bwd", impl="torch eager autograd", **ffn_shape), step(eager), None)]
    if not quick:
        block.append((dict(op="ffn fwd+bwd", impl="torch.compile", **ffn_shape),
                      step(torch.compile(eager)), None))
    # config=None takes TMA_CONFIG at this size on Hopper (the row records `default`)
    block.append((dict(op="ffn fwd+bwd", impl="triton FFNFunction (gelu)", config=str(default),
                       **ffn_shape),
                  step(lambda *p: _with_config(cfg, k.ffn, *p, "gelu")), vs_autograd))
    # a step takes ~10 ms: rounds of 300 ms give each ~30 calls (70 ms, the default, gave 7)
    _interleaved(rows, block, ffn_flops, rounds, warmup_ms=100, rep_ms=300)
    if quick:
        rows.append(dict(op="ffn fwd+bwd", impl="torch.compile", skipped="quick run", **ffn_shape))
        return rows

    # ---- the regime of these timings: each layer back to back for 3 s, power and clock sampled
    # by nvidia-smi. At the power cap the clock is what the cap allows, and time is energy / cap.
    power = [
        (dict(op=SUSTAINED, impl=CUBLAS, **shape),
         lambda: F.linear(x, W, b), flops),
        (dict(op=SUSTAINED, impl="triton linear_act gelu", **shape),
         lambda: k._linear_act_forward(x, W, b, "gelu")[0], flops),
        (dict(op=SUSTAINED, impl="triton linear_act none", **shape),
         lambda: k._linear_act_forward(x, W, b, "none")[0], flops),
        (dict(op=SUSTAINED, impl="torch eager autograd (ffn fwd+bwd)", **ffn_shape), block[0][1],
         ffn_flops),
        (dict(op=SUSTAINED, impl="triton FFNFunction (gelu) (ffn fwd+bwd)", **ffn_shape),
         block[-1][1], ffn_flops),
        *((dict(op=SUSTAINED, impl=row["impl"], **shape), fn, flops)
          for row, fn, _ in training[1:]),  # ours both ways, and eager's dZ1
    ]
    for row, fn, row_flops in power:
        try:
            got = _harness.sustained(fn)
            row.update(got, ms=round(got["ms"], 4), tflops=_tflops(got["ms"], row_flops))
        except Exception as e:  # noqa: BLE001 - no nvidia-smi, or no samples: say so
            row["skipped"] = f"{type(e).__name__}: {e}"[:400]
        _record(rows, row)

    # ---- what the epilogue's activation costs at the cap: our kernel with each activation and
    # cuBLAS, each sustained 3 s, in ENERGY_PASSES passes in turn (A B C .., A B C ..) so that a
    # drift of the board falls on all; energy a call = ms x W. Beside each, the SASS
    # instructions the activation adds per output element (benchmarks/_epilogue_sass.py).
    try:
        from benchmarks._epilogue_sass import instructions_per_element

        instr = instructions_per_element()
    except Exception as e:  # noqa: BLE001 - no cuobjdump: the energies still stand
        instr, instr_error = {}, f"{type(e).__name__}: {e}"[:400]
    else:
        instr_error = None
    energy = [(dict(op=ENERGY, impl=CUBLAS, **shape),
               lambda: F.linear(x, W, b))]
    layers = [("triton linear_act", act, lambda act=act: k._linear_act_forward(x, W, b, act)[0])
              for act in k.ACTIVATIONS]
    for kernel_name, act, fn in layers:
        row = dict(op=ENERGY, impl=f"{kernel_name} {act}", activation=act, **shape)
        if act in instr:
            row["sass_per_element"] = instr[act]
        elif instr_error:
            row["sass_error"] = instr_error
        energy.append((row, fn))
    for _ in range(ENERGY_PASSES):
        for row, fn in energy:
            try:
                got = _harness.sustained(fn)
            except Exception as e:  # noqa: BLE001 - no nvidia-smi, or no samples: say so
                row["skipped"] = f"{type(e).__name__}: {e}"[:400]
                continue
            row.setdefault("passes", []).append(
                {key: got[key] for key in ("ms", "power_w", "sm_mhz", "clock_reasons")})
    for row, _ in energy:
        passes = row.get("passes", [])
        if len(passes) == ENERGY_PASSES:
            row.pop("skipped", None)
            ms = sum(p["ms"] for p in passes) / len(passes)
            joules = [p["ms"] * p["power_w"] / 1e3 for p in passes]
            row.update(ms=round(ms, 4), tflops=_tflops(ms, flops),
                       joules=round(sum(joules) / len(joules), 4),
                       joules_passes=[round(j, 4) for j in joules],
                       power_w=round(sum(p["power_w"] for p in passes) / len(passes), 1),
                       sm_mhz=sum(p["sm_mhz"] for p in passes) / len(passes),
                       clock_reasons=sorted({c for p in passes for c in p["clock_reasons"]}))
        _record(rows, row)
    return rows


def summary(rows: list[dict], meta: dict) -> str:
    from kernelnotes.ffn.figures import ratios

    lines = [f"ffn on {meta.get('gpu', '?')} (copy ceiling {meta.get('copy_gbs', '?')} GB/s):"]
    for r in rows:
        what = f"{r['op']:>15} | {r['impl']:<40}"
        if "ms" in r:
            lines.append(f"  {what} {r['ms']:8.3f} ms {r['tflops']:6.1f} TFLOP/s"
                         + (f" {r['power_w']:.0f} W {r['sm_mhz']:.0f} MHz {r['clock_reasons']}"
                            if "power_w" in r else ""))
        else:
            lines.append(f"  {what} {r.get('error') or r.get('skipped')}")
    for what, ratio, target in ratios(rows):
        got = "n/a" if ratio is None else f"{ratio:.3f}x"
        ok = "" if ratio is None else ("  ok" if ratio >= target else "  MISSED")
        lines.append(f"  {what}: {got} (target >= {target}x){ok}")
    return "\n".join(lines)
