"""Batched small fp32 LU, QR and least squares: kernelnotes.linalg against torch.linalg (cuSOLVER).

Both sides get the same fp32 batch in the same run. Each Triton result is checked (backward error)
before it is timed. Bytes are what a kernel must move at least: the input once and the output once;
the fraction of the roofline is bytes / time / (measured copy bandwidth of this run).

Napkin math, per matrix (fp32, 4 bytes; p = min(m, n)):
  lu_factor  reads n^2, writes n^2 + n pivots + 1 info          FLOPs 2/3 n^3
  lu_solve   reads n^2 + n + n k, writes n k                    FLOPs 2 n^2 k
  qr         reads m n, writes m p (Q) + p n (R)                FLOPs 2 m n^2 - 2/3 n^3 to factor,
                                                                as much again to form Q (m = n)
  lstsq      reads m n + m k, writes n k, k residuals, rank (8 B)
                                                                FLOPs 2 m n^2 - 2/3 n^3 + 4 m n k
E.g. qr at 65536 x 16 x 16 moves 65536 * 3 * 256 * 4 B = 201 MB: 47 us at 4.25 TB/s.
"""

from __future__ import annotations

import functools

from benchmarks._harness import bench_ms

# (batch, m, n, k): the sizes (batch * n^2 = 16 Mi entries for the square ones)
SQUARE = [(65536, 16), (16384, 32), (4096, 64)]
LSTSQ = [(65536, 64, 16, 1), (16384, 128, 32, 1)]
SOLVE = [(65536, 16, 1), (16384, 32, 1)]
TARGETS = {  # (op, batch, m, n): the speed-up over torch.linalg the issue asks for
    ("qr", 65536, 16, 16): 100.0, ("qr", 16384, 32, 32): 100.0,
    ("lu_factor", 65536, 16, 16): 1.0, ("lu_factor", 16384, 32, 32): 1.0,
    ("lstsq", 65536, 64, 16): 2.0,
}


def _time(fn) -> tuple[float, float, float]:
    """bench_ms, except for calls over 100 ms (torch.linalg.qr takes seconds): one timed call."""
    import torch

    fn()  # warm-up: compilation, autotuning, cuSOLVER handles
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)
    if ms > 100.0:
        return ms, ms, ms
    return bench_ms(fn)


def _row(op, impl, batch, m, n, k, times, nbytes, flops, **extra) -> dict:
    p50, p20, p80 = times
    if impl == "triton":
        extra["target"] = TARGETS.get((op, batch, m, n))
    return {"op": op, "impl": impl, "batch": batch, "m": m, "n": n, "k": k,
            "ms": p50, "ms_p20": p20, "ms_p80": p80, "bytes": nbytes, "flops": flops,
            "gbs": nbytes / (p50 * 1e-3) / 1e9, "gflops": flops / (p50 * 1e-3) / 1e9, **extra}


def _backward_error(lhs, rhs) -> float:
    """max over the batch of ||lhs - rhs||_F / ||rhs||_F, in float64."""
    d = (lhs.double() - rhs.double()).flatten(1).norm(dim=1)
    return float((d / rhs.double().flatten(1).norm(dim=1)).max())


def run(quick: bool) -> list[dict]:
    import torch

    from kernelnotes.linalg import kernel as K

    torch.manual_seed(0)
    scale = 16 if quick else 1  # quick: a sixteenth of each batch, for a smoke run
    rows: list[dict] = []
    square = SQUARE[:1] if quick else SQUARE
    for batch, n in square:
        batch //= scale
        A = torch.randn(batch, n, n, device="cuda")
        # ---- lu_factor
        LU, piv, info = K.lu_factor_ex(A)
        L = torch.tril(LU, -1) + torch.eye(n, device="cuda")
        perm = K.row_permutation(piv)
        pa = torch.gather(A, 1, perm[..., None].expand(-1, -1, n))
        err = _backward_error(L @ torch.triu(LU), pa)
        nbytes = batch * (4 * 2 * n * n + 4 * n + 4)
        flops = batch * 2 * n**3 / 3
        rows.append(_row("lu_factor", "triton", batch, n, n, 0,
                         _time(functools.partial(K.lu_factor_ex, A)), nbytes, flops,
                         backward_error=err, singular=int((info != 0).sum()),
                         config=(f"rows kernel {_describe(K.rows_config(K._pow2(n)))}"
                                 if n <= K.ROWS_MAX_N
                                 else _describe(getattr(K._lu_factor_tuned, "best_config", None)))))
        rows.append(_row("lu_factor", "torch", batch, n, n, 0,
                         _time(functools.partial(torch.linalg.lu_factor_ex, A)), nbytes, flops))
        # ---- qr (reduced)
        Q, R = K.qr(A)
        err = max(_backward_error(Q @ R, A),
                  _backward_error(Q.mT @ Q, torch.eye(n, device="cuda").expand(batch, n, n)))
        nbytes = batch * 4 * 3 * n * n
        flops = batch * 8 * n**3 / 3  # 4/3 n^3 to factor and 4/3 n^3 to form Q (m = n)
        rows.append(_row("qr", "triton", batch, n, n, 0, _time(functools.partial(K.qr, A)),
                         nbytes, flops, backward_error=err))
        rows.append(_row("qr", "torch", batch, n, n, 0,
                         _time(functools.partial(torch.linalg.qr, A)), nbytes, flops))
        del A, LU, piv, info, L, perm, pa, Q, R
    for batch, n, k in (SOLVE[:1] if quick else SOLVE):
        batch //= scale
        A = torch.randn(batch, n, n, device="cuda") + n**0.5 * torch.eye(n, device="cuda")
        B = torch.randn(batch, n, k, device="cuda")
        LU, piv = K.lu_factor(A)
        X = K.lu_solve(LU, piv, B)
        res = (A.double() @ X.double() - B.double()).flatten(1).norm(dim=1)
        # ||AX - B|| / (||A|| ||X||)
        err = float((res / (A.double().flatten(1).norm(dim=1)
                            * X.double().flatten(1).norm(dim=1))).max())
        nbytes = batch * 4 * (n * n + n + 2 * n * k)
        flops = batch * 2 * n * n * k
        rows.append(_row("lu_solve", "triton", batch, n, n, k,
                         _time(functools.partial(K.lu_solve, LU, piv, B)), nbytes, flops,
                         backward_error=err))
        rows.append(_row("lu_solve", "torch", batch, n, n, k,
                         _time(functools.partial(torch.linalg.lu_solve, LU, piv, B)), nbytes,
                         flops))
        del A, B, LU, piv, X
    for batch, m, n, k in (LSTSQ[:1] if quick else LSTSQ):
        batch //= scale
        A = torch.randn(batch, m, n, device="cuda")
        B = torch.randn(batch, m, k, device="cuda")
        X, _, rank, _ = K.lstsq(A, B)
        X_ref = torch.linalg.lstsq(A.double(), B.double()).solution
        err = _backward_error(X, X_ref)  # forward error against float64; cond(A) is about 3
        nbytes = batch * (4 * (m * n + m * k + n * k + k) + 8)  # + residuals, int64 rank
        flops = batch * (2 * m * n * n - 2 * n**3 / 3 + 4 * m * n * k)
        rows.append(_row("lstsq", "triton", batch, m, n, k,
                         _time(functools.partial(K.lstsq, A, B)), nbytes, flops,
                         forward_error=err, rank_deficient=int((rank < n).sum())))
        rows.append(_row("lstsq", "torch", batch, m, n, k,
                         _time(functools.partial(torch.linalg.lstsq, A, B)), nbytes, flops))
        del A, B, X, X_ref, rank
    return rows


def _describe(c) -> str:
    """A launch config as text ("?" for None: the autotuner has not run)."""
    return "?" if c is None else " ".join([*(f"{k}={v}" for k, v in c.kwargs.items()),
                                           f"num_warps={c.num_warps}"])


def ratios(rows: list[dict]) -> list[dict]:
    """One record per (op, size): Triton ms, torch ms, speed-up, roofline fraction, target."""
    out = []
    for r in rows:
        if r["impl"] != "triton":
            continue
        peer = next((t for t in rows if t["impl"] == "torch" and all(
            t[f] == r[f] for f in ("op", "batch", "m", "n", "k"))), None)
        if peer is None:
            continue
        out.append({**{f: r[f] for f in ("op", "batch", "m", "n", "k")},
                    "ms": r["ms"], "torch_ms": peer["ms"], "speedup": peer["ms"] / r["ms"],
                    "gbs": r["gbs"], "torch_gbs": peer["gbs"],
                    "target": r.get("target")})
    return out


def summary(rows: list[dict], meta: dict) -> str:
    lines = []
    for q in ratios(rows):
        roof = q["gbs"] / meta["copy_gbs"]
        target = f" (target >= {q['target']:g}x)" if q["target"] else ""
        met = "" if not q["target"] else ("  MET" if q["speedup"] >= q["target"] else "  MISSED")
        k = f" k={q['k']}" if q["k"] else ""
        lines.append(f"{q['op']} {q['m']}x{q['n']}{k} b{q['batch']}: {q['ms']:.3f} ms vs "
                     f"{q['torch_ms']:.3f} ms = {q['speedup']:.{2 if q['speedup'] < 10 else 0}f}x "
                     f"torch.linalg{target}{met}; "
                     f"{100 * roof:.0f}% of the {meta['copy_gbs']:.0f} GB/s copy roofline")
    for r in rows:
        if "config" in r:
            lines.append(f"  config {r['op']} {r['m']}x{r['n']} b{r['batch']}: {r['config']}")
        for f in ("backward_error", "forward_error"):
            if f in r:
                lines.append(f"  check {r['op']} {r['m']}x{r['n']} b{r['batch']}: {f} {r[f]:.2e}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    from benchmarks.__main__ import main

    raise SystemExit(main(["linalg", *sys.argv[1:]]))
