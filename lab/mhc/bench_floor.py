"""The floor of every two-pass ``mhc_pre`` at T = 8192, timed the way ``bench_mhc`` times the call.

A two-pass design reads the residual once for the projection and once more for ``layer_input``.
Here both passes are bare: a read of the residual that sums its squares (``bench_mhc.read_sq``,
no MMA) and a fuse that writes the plain mean of the four streams as ``layer_input`` (no gates, no
Sinkhorn). Launched back to back, after ``fn``'s split or without it, they move what every
two-pass ``mhc_pre`` must move and compute nothing else. They are timed as one call, like
``bench_mhc``'s rows (``do_bench``, its write flush included; interleaved rounds) and replayed from
a CUDA graph, beside the shipped call, the call given ``fn`` split once, and the eager reference.
"""

from __future__ import annotations

import statistics
import time

import triton
import triton.language as tl

from benchmarks._harness import bench_interleaved, graph_ms
from benchmarks.bench_mhc import make_inputs, read_sq

# the rows' labels, in NOTES.md's order; the parts of the bare passes are timed alone (no rate)
FLOOR_CALLS = {"mhc_pre": "`mhc_pre`", "mhc_pre, fn split once": "`mhc_pre`, fn split once",
               "bare passes": "bare passes: split, read, fuse",
               "bare passes, fn split once": "bare passes: read, fuse",
               "bare read": "bare read", "bare fuse": "bare fuse"}
FLOOR_PARTS = ("bare read", "bare fuse")

T = 8192
H_ALL, H_QUICK = (4096, 7168), (7168,)
FUSE_TILES = ((1, 1024, 4), (2, 1024, 4), (1, 2048, 8), (4, 1024, 8), (8, 512, 8))  # BT, BH, warps
CALLS = (*FLOOR_CALLS, "eager")


@triton.jit
def _bare_fuse(x_ptr, out_ptr, T, H, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t, :] = the mean of residual[t, j, :] over the 4 streams: the big-fuse's bytes only."""
    n_h = tl.cdiv(H, BLOCK_H)
    offs_t = ((tl.program_id(0) // n_h) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    offs_h = (tl.program_id(0) % n_h) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (offs_t < T)[:, None] & (offs_h < H)[None, :]
    x = x_ptr + offs_t[:, None] * (4 * H) + offs_h[None, :]
    acc = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(1, 4):
        acc += tl.load(x + j * H, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_t[:, None] * H + offs_h[None, :], (0.25 * acc).to(tl.bfloat16),
             mask=mask)


def _calls(H: int, quick: bool) -> tuple[dict, tuple]:
    """{name: zero-argument call} for one H, and the bare fuse's tile (the fastest replayed)."""
    import torch
    from triton import cdiv

    from kernelnotes.mhc import kernel
    from kernelnotes.mhc.torch_reference import mhc_pre_torch

    residual, fn, scale, base = make_inputs(T, H)[:4]
    parts = kernel.split_fn(fn)
    K = 4 * H
    out = torch.empty((T, H), dtype=torch.bfloat16, device="cuda")
    partial = torch.empty(4 * T, device="cuda")
    mean = (residual.float().sum(1) * 0.25).bfloat16()

    def read():
        read_sq[(4, cdiv(T, 8))](residual, partial, T, K, K // 4, BT=8, BK=1024, num_warps=4)

    def fuse_with(bt, bh, warps):
        return lambda: _bare_fuse[(cdiv(T, bt) * cdiv(H, bh),)](residual, out, T, H, BLOCK_T=bt,
                                                                BLOCK_H=bh, num_warps=warps)

    replayed = {}
    for tile in FUSE_TILES[:1] if quick else FUSE_TILES:
        out.fill_(float("nan"))
        fuse_with(*tile)()
        if not torch.equal(out, mean):  # a floor must do the work it stands for
            raise RuntimeError(f"bare fuse {tile}: layer_input is not the streams' mean")
        replayed[tile] = graph_ms(fuse_with(*tile), replays=20)
    tile = min(replayed, key=replayed.get)
    fuse = fuse_with(*tile)

    def bare_passes():
        kernel.split_fn(fn)
        read()
        fuse()

    def bare_passes_once():
        read()
        fuse()

    calls = {"mhc_pre": lambda: kernel.mhc_pre(residual, fn, scale, base),
             "mhc_pre, fn split once": lambda: kernel.mhc_pre(residual, parts, scale, base),
             "bare passes": bare_passes, "bare passes, fn split once": bare_passes_once,
             "bare read": read, "bare fuse": fuse,
             "eager": lambda: mhc_pre_torch(residual, fn, scale, base)}
    assert tuple(calls) == CALLS
    return calls, tile


def run(quick: bool) -> list[dict]:
    import torch

    t0 = time.time()
    rows = []
    for H in H_QUICK if quick else H_ALL:
        calls, tile = _calls(H, quick)
        for f in calls.values():
            f()
        torch.cuda.synchronize()
        rounds = 2 if quick else 5
        direct = bench_interleaved({k: f for k, f in calls.items() if k != "eager"}, rounds=rounds)
        eager = {"eager": calls["eager"]}  # 4 ms a call: fewer rounds
        direct["eager"] = bench_interleaved(eager, rounds=min(rounds, 3))["eager"]
        replayed = {k: [] for k in calls}
        for _ in range(1 if quick else 3):  # interleaved, like the direct calls
            for k, f in calls.items():
                replayed[k].append(graph_ms(f, replays=10 if k == "eager" else 20))
        for k in calls:
            p50, p20, p80 = direct[k]
            rows.append({"call": k, "T": T, "H": H, "ms": p50, "ms_p20": p20, "ms_p80": p80,
                         "graph_ms": statistics.median(replayed[k]), "rounds": rounds,
                         "fuse_tile": {"BLOCK_T": tile[0], "BLOCK_H": tile[1],
                                       "num_warps": tile[2]}})
            print(f"H={H} {k}: direct {1e3 * p50:.1f} us, graph "
                  f"{1e3 * rows[-1]['graph_ms']:.1f} us", flush=True)
        del calls
        torch.cuda.empty_cache()
    print(f"mhc_floor: done in {time.time() - t0:.0f} s", flush=True)
    return rows


def summary(rows: list[dict], meta: dict) -> str:
    from kernelnotes.mhc.reference import bytes_per_token

    copy = meta["copy_gbs"] * 1e9
    lines = ["mhc_pre and the bare two passes at T = 8192 (direct call; graph): us, of copy"]
    eager = {r["H"]: r["ms"] for r in rows if r["call"] == "eager"}
    for r in rows:
        if r["call"] in FLOOR_PARTS:
            lines.append(f"H={r['H']} {r['call']}: {1e3 * r['ms']:.1f}; "
                         f"{1e3 * r['graph_ms']:.1f}")
            continue
        nbytes = r["T"] * bytes_per_token("mhc_pre", r["H"])
        lines.append(f"H={r['H']} {r['call']}: {1e3 * r['ms']:.1f} "
                     f"({100 * nbytes / (r['ms'] * 1e-3) / copy:.1f}%, "
                     f"{eager[r['H']] / r['ms']:.2f}x eager); {1e3 * r['graph_ms']:.1f} "
                     f"({100 * nbytes / (r['graph_ms'] * 1e-3) / copy:.1f}%)")
    return "\n".join(lines)
