"""What the L2 flush before each timed call costs mHC's direct calls at T = 8192, in one run.

``bench_mhc`` times direct calls with Triton's ``do_bench``, which empties the L2 before each
call by writing zeros over a 256 MB buffer. The lines that write leaves dirty in L2 go back to
HBM while the timed call runs, and take from its bandwidth. Each call is timed here
- replayed from a CUDA graph, back to back and with no flush (``graph_ms``);
- after the write flush (``do_bench``'s, kept here as ``zero_``), issued right away;
- after the write flush and a GPU sleep long enough that the host has issued every launch of the
  call before the GPU reaches it: if the host were the slow side, this would be faster;
- after a read flush (a sum over the same buffer: it evicts L2 as well but leaves nothing
  dirty), with and without the sleep.
The eager torch reference of ``mhc_pre`` is timed the same ways, so that the 15x ratio can be
read under each flush.
"""

from __future__ import annotations

import statistics
import time

from benchmarks._harness import graph_ms
from benchmarks.bench_mhc import calls as _calls

FLUSH_TIMINGS = ("graph", "write flush", "write flush + sleep", "read flush",
                 "read flush + sleep")  # the columns, in NOTES.md's order

T_FULL = 8192
H_ALL = (4096, 7168)
FLUSH_BYTES = 256 * 2**20  # as do_bench's
SLEEP_US = 300.0  # longer than the host needs to issue any of the Triton calls (three launches)


def _timed_ms(fn, flush, sleep_cycles: int, calls: int) -> float:
    """Median ms of ``fn()`` between two events, each call after ``flush()`` (and a GPU sleep)."""
    import torch

    pairs = []
    for _ in range(calls + 5):  # the first five are a warm-up
        flush()
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs[5:])


def _sleep_cycles(us: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for ``us`` microseconds at the SM clock
    measured here (the H200 boosts to about 1.98 GHz under load)."""
    import torch

    torch.cuda._sleep(1000)  # warm
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    cycles_per_us = 10**7 / (start.elapsed_time(end) * 1e3)
    return int(us * cycles_per_us)


def run(quick: bool) -> list[dict]:
    import torch

    from kernelnotes.mhc import kernel
    from kernelnotes.mhc.torch_reference import (
        mhc_post_torch,
        mhc_pre_from_mixes_torch,
        mhc_pre_torch,
    )

    t0 = time.time()
    cache = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    flushes = {"write": cache.zero_, "read": lambda: torch.sum(cache, dim=0, out=sink)}
    cycles = _sleep_cycles(SLEEP_US)
    impls = {"triton": (kernel.mhc_pre, kernel.mhc_pre_from_mixes, kernel.mhc_post),
             "eager": (mhc_pre_torch, mhc_pre_from_mixes_torch, mhc_post_torch)}
    calls_per_timing = 30 if quick else 200
    rows = []
    for H in (7168,) if quick else H_ALL:
        for op, by_impl in _calls(impls, T_FULL, H).items():
            for impl, fn in by_impl.items():
                if impl == "eager" and op != "mhc_pre":
                    continue
                n = calls_per_timing if impl != "eager" else calls_per_timing // 10
                fn()
                ms = {"graph": graph_ms(fn, replays=20 if impl == "eager" else 100)}
                for flush in ("write", "read"):
                    for sleep in (False, True):
                        name = f"{flush} flush" + (" + sleep" if sleep else "")
                        ms[name] = _timed_ms(fn, flushes[flush], cycles if sleep else 0, n)
                rows.append({"op": op, "impl": impl, "T": T_FULL, "H": H, "calls": n,
                             "sleep_us": SLEEP_US, "flush_bytes": FLUSH_BYTES,
                             **{f"{k} ms": v for k, v in ms.items()}})
                print(f"H={H} {op} {impl}: " + ", ".join(f"{k} {1e3 * v:.1f} us"
                                                          for k, v in ms.items()), flush=True)
        torch.cuda.empty_cache()
    print(f"mhc_flush: done in {time.time() - t0:.0f} s", flush=True)
    return rows


def summary(rows: list[dict], meta: dict) -> str:
    lines = ["mHC at T = 8192: direct-call time (us) by the flush before it; GPU time replayed"]
    for r in rows:
        lines.append(f"{r['op']} {r['impl']} H={r['H']}: " + ", ".join(
            f"{k} {1e3 * r[f'{k} ms']:.1f}" for k in FLUSH_TIMINGS))
    return "\n".join(lines)
