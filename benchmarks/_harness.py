"""What every benchmark shares: timing, the measured copy ceiling, and result files with
provenance.

Benchmarks are not tests: they run on a CUDA GPU, time this project's kernel and the peers its
issue names in the same run, and write ``benchmarks/results/<topic>.json``, from which the posts
draw their tables and figures.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import platform
import statistics
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
QUANTILES = [0.5, 0.2, 0.8]


def bench_ms(fn, *, warmup_ms: int = 50, rep_ms: int = 300) -> tuple[float, float, float]:
    """(p50, p20, p80) milliseconds of ``fn()`` by CUDA events (``triton.testing.do_bench``)."""
    import triton

    p50, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=QUANTILES)
    return p50, p20, p80


def bench_interleaved(fns: dict, *, rounds: int = 3, warmup_ms: int = 25,
                      rep_ms: int = 70) -> dict:
    """{key: (p50, p20, p80)} of every ``fns[key]()``, timed in ``rounds`` interleaved rounds
    (A B C, A B C, ...), each quantile the median over the rounds. The same kernel timed twice in
    one run can differ by a few percent (clocks, temperature); interleaving lets that drift fall
    on every implementation alike instead of on whichever was timed at a bad moment."""
    samples: dict = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            samples[key].append(bench_ms(fn, warmup_ms=warmup_ms, rep_ms=rep_ms))
    return {key: tuple(statistics.median(s[i] for s in runs) for i in range(3))
            for key, runs in samples.items()}


# NVML's clock event reasons (nvidia-smi clocks_event_reasons.active): why the SM clock is below
# its maximum; several can hold at once.
CLOCK_REASONS = {0x1: "GPU idle", 0x2: "applications clocks setting", 0x4: "software power cap",
                 0x8: "hardware slowdown", 0x10: "sync boost", 0x20: "software thermal slowdown",
                 0x40: "hardware thermal slowdown", 0x80: "hardware power brake",
                 0x100: "display clock setting"}
_SMI_FIELDS = "timestamp,power.draw,power.limit,clocks.sm,clocks.max.sm,clocks_event_reasons.active"


def sustained(fn, *, seconds: float = 3.0, settle_s: float = 0.5, interval_ms: int = 100) -> dict:
    """``fn()`` back to back for ``seconds`` while nvidia-smi samples the GPU every
    ``interval_ms``: {ms, power_w, power_limit_w, sm_mhz, max_sm_mhz, clock_reasons, samples}
    (medians over the samples after the first ``settle_s``). A GPU at its power cap runs at
    whatever clock the cap allows, so there a kernel's time is its energy over the cap; this
    says which regime a timing was taken in. Raises RuntimeError without nvidia-smi."""
    import datetime
    import shutil
    import time

    import torch

    if shutil.which("nvidia-smi") is None:
        raise RuntimeError("nvidia-smi not found")
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--id=GPU-{uuid}", f"--query-gpu={_SMI_FIELDS}",
                            "--format=csv,noheader,nounits", f"-lms={interval_ms}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3 * interval_ms / 1000)  # nvidia-smi up before the clock starts
        begin = datetime.datetime.now()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls, stop, queued = 0, time.perf_counter() + seconds, None
        start.record()
        while calls == 0 or time.perf_counter() < stop:
            for _ in range(5):
                fn()
            calls += 5
            batch = torch.cuda.Event()
            batch.record()
            if queued is not None:  # one batch queued behind the running one: no idle gaps,
                queued.synchronize()  # and the host's clock stays within a batch of the GPU's
            queued = batch
        end.record()
        torch.cuda.synchronize()
        finish = datetime.datetime.now()
    finally:
        smi.terminate()
        out, err = smi.communicate(timeout=30)
    got = smi_summary(out, begin + datetime.timedelta(seconds=settle_s), finish)
    if not got:
        raise RuntimeError(f"no nvidia-smi samples while loaded: {err.strip()[:200]}")
    return {"ms": start.elapsed_time(end) / calls, **got}


def smi_summary(text: str, begin, finish) -> dict:
    """Medians of the nvidia-smi lines (``_SMI_FIELDS``, csv, no header, no units) stamped
    within [begin, finish], and every clock event reason any of them had; {} if none."""
    import datetime

    samples = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        try:
            stamp = datetime.datetime.strptime(cols[0], "%Y/%m/%d %H:%M:%S.%f")
            values = [float(c) for c in cols[1:5]] + [int(cols[5], 16)]
        except (ValueError, IndexError):
            continue  # "[N/A]" fields, a line cut off by terminate()
        if begin <= stamp <= finish:
            samples.append(values)
    if not samples:
        return {}
    mask = 0
    for s in samples:
        mask |= s[4]

    def median(i):
        return round(statistics.median(s[i] for s in samples), 1)

    return {"power_w": median(0), "power_limit_w": median(1), "sm_mhz": median(2),
            "max_sm_mhz": median(3),
            "clock_reasons": [name for bit, name in CLOCK_REASONS.items() if mask & bit],
            "samples": len(samples)}


def graph_ms(fn, *, replays: int = 100, rounds: int = 3) -> float:
    """Milliseconds of GPU time per ``fn()`` with the host out of the way: one call captured in a
    CUDA graph, replayed ``replays`` times back to back between two events (median of ``rounds``).

    A direct call of a small problem takes as long as its host side (Python, argument checks,
    launches) and says little about the kernels; serving stacks replay graphs like this one.
    Back-to-back replays leave the inputs in L2 when they fit there, as in a model's layer loop."""
    import torch

    fn()  # compile and autotune outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as torch asks before a capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    del graph
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy rate, bytes read + written per second: this run's memory ceiling."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    p50, _, _ = bench_ms(functools.partial(dst.copy_, src))
    del src, dst
    return 2 * nbytes / (p50 * 1e-3) / 1e9


def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def _git(*args: str, cwd: Path = RESULTS.parent) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, timeout=30, check=True,
                          cwd=cwd).stdout.strip()


def check_commit(commit: str, root: Path = RESULTS.parent.parent) -> str:
    """The commit a run is labelled with (``--commit``), refused with ValueError if git here
    knows it and the sources here (``src/``, ``benchmarks/`` but its results) differ from it:
    a label must name the code that ran. A commit that git here does not know (a copy of the
    tree without its newest history, as on a lent GPU machine) is taken as given."""
    try:
        _git("cat-file", "-e", f"{commit}^{{commit}}", cwd=root)
    except (OSError, subprocess.SubprocessError):
        return commit  # nothing here to check it against
    changed = _git("diff", "--name-only", commit, "--", "src", "benchmarks",
                   ":(exclude)benchmarks/results", cwd=root).splitlines()
    if changed:
        raise ValueError(f"--commit {commit}: the sources here differ from it in "
                         f"{len(changed)} file(s): {', '.join(changed[:5])}")
    return commit


def _commit() -> str:
    """HEAD's full hash, with "-dirty" when tracked files have uncommitted changes: a result
    measured on edited code must not pass for the commit's."""
    try:
        head = _git("rev-parse", "HEAD")
        return head + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(commit: str | None = None) -> dict:
    import torch
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "driver": _driver(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "commit": _commit() if commit is None else check_commit(commit),
    }


def write(topic: str, rows: list[dict], meta: dict, out_dir: Path = RESULTS) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{topic}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return path
