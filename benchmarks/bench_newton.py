"""sqrt / rsqrt: this project's Newton-refined Triton kernels against torch.sqrt / torch.rsqrt.

Napkin math: an elementwise op on n float32 moves 4 bytes in and 4 out, 8n bytes; at 2^28
elements that is 2.1 GB, about 0.5 ms at 4.3 TB/s. The ~20 flops per element (bit trick, three
Newton steps, fixups) are ~5 GFLOP, a tenth of that time at 67 TFLOP/s, so both are memory bound and
the target is torch's bandwidth: at least 95% of it at 2^28 elements.

``ms`` times the public call (which launches the kernel directly when nothing traces it and no
gradient is needed); ``op_ms`` times the same work through the dispatcher, the custom operator
``kernelnotes::sqrt_out`` that autograd and torch.compile see. At small n the difference is the
host time the operator's Python round trip adds per call.
"""

from __future__ import annotations

import functools

import torch

from benchmarks._harness import bench_interleaved

TARGET = 0.95


def run(quick: bool = False) -> list[dict]:
    from kernelnotes.newton import rsqrt, sqrt

    rows = []
    sizes = [1 << 24] if quick else [1 << 20, 1 << 24, 1 << 28]
    dtypes = [torch.float32] if quick else [torch.float32, torch.bfloat16]
    for dtype in dtypes:
        for n in sizes:
            x = torch.rand(n, device="cuda", dtype=torch.float32).mul_(1e4).to(dtype)
            out = torch.empty_like(x)
            nbytes = 2 * n * x.element_size()
            for op, mine, peer in [("sqrt", sqrt, torch.sqrt), ("rsqrt", rsqrt, torch.rsqrt)]:
                operator = getattr(torch.ops.kernelnotes, f"{op}_out").default
                # interleaved rounds: clock drift falls on all alike (the targets sit near 0.95)
                times = bench_interleaved({"ours": functools.partial(mine, x, out=out),
                                           "op": functools.partial(operator, x, out),
                                           "torch": functools.partial(peer, x, out=out)})
                (ms, ms20, ms80), (tms, _, _) = times["ours"], times["torch"]
                rows.append(
                    {
                        "op": op,
                        "dtype": str(dtype).removeprefix("torch."),
                        "n": n,
                        "ms": ms,
                        "ms_p20": ms20,
                        "ms_p80": ms80,
                        "gbs": nbytes / ms / 1e6,
                        "op_ms": times["op"][0],
                        "torch_ms": tms,
                        "torch_gbs": nbytes / tms / 1e6,
                    }
                )
            del x, out
    return rows


def summary(rows: list[dict], meta: dict) -> str:
    lines = []
    for r in rows:
        ratio = r["gbs"] / r["torch_gbs"]
        flag = (
            ""
            if r["n"] < (1 << 28)
            else f"  (target >= {TARGET:.2f}: {'met' if ratio >= TARGET else 'MISSED'})"
        )
        lines.append(
            f"{r['op']:5s} {r['dtype']:8s} n=2^{r['n'].bit_length() - 1}: {r['gbs']:6.0f} GB/s "
            f"vs torch {r['torch_gbs']:6.0f} GB/s = {ratio:.3f}x, "
            f"{r['gbs'] / meta['copy_gbs']:.0%} of copy{flag}"
            + (f"; through the operator {1e3 * r['op_ms']:.1f} us" if "op_ms" in r else "")
        )
    return "\n".join(lines)
