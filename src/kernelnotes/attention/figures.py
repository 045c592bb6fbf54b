"""Figures and tables of the FlashAttention-2 post, computed at build time (hooks/computed.py).

The worked example and the memory arithmetic come from ``reference.py``; the performance table
and figure come only from ``benchmarks/results/attention.json`` (written on the GPU), and say
that results are pending while that file does not exist.
"""

from __future__ import annotations

import functools
import tracemalloc

import numpy as np

from kernelnotes import _results
from kernelnotes.attention import reference as ref

H200_SMEM = 228 * 1024  # shared memory per SM on the H200 (bytes)
# issue 3's targets at D in {64, 128}, N >= 4096: this kernel's speed / the peer's
TARGETS = {("fwd", "sdpa_flash"): 1.4, ("fwd", "sdpa_cudnn"): 0.85, ("bwd", "sdpa_flash"): 1.2}
PENDING = ('!!! note "Results pending"\n    Results pending: run `python -m benchmarks attention` '
           "on a GPU; the table and the figure are drawn from "
           "`benchmarks/results/attention.json`.")


# ----------------------------------------------------------------------------- worked example
def example():
    """The worked example of the post: N = 6, d = 2, used with σ = 1 (easier by hand)."""
    Q = np.array([[2, -1], [-2, 5], [4, 1], [0, 2], [3, 0], [1, -3]], float)
    K = np.array([[1, -2], [0, 3], [4, 1], [-1, 2], [5, 0], [2, -4]], float)
    V = np.array([[3, 0], [1, 2], [-2, 1], [5, -3], [4, 0], [-1, 2]], float)
    return Q, K, V


def _num(x: float) -> str:
    if x == -np.inf:
        return r"-\infty"
    if x == 0 or (abs(x) >= 1e-3 and float(np.round(x, 4)) == x):
        return f"{x:g}"
    if abs(x) < 1e-3:
        m, e = f"{x:.3e}".split("e")
        return rf"{m}\times 10^{{{int(e)}}}"
    return f"{x:.4f}"


def _mat(A) -> str:
    A = np.atleast_2d(A)
    rows = r" \\ ".join(" & ".join(_num(x) for x in row) for row in A)
    return rf"$\begin{{bmatrix}} {rows} \end{{bmatrix}}$"


def _col(a) -> str:
    return _mat(np.asarray(a)[:, None])


def table_worked_example() -> str:
    """Every inner step (i = 1, j = 1..3) of the FA2 forward on the example, from the trace."""
    Q, K, V = example()
    trace: list = []
    ref.flash_attention_forward(Q, K, V, 2, 2, sm_scale=1.0, trace=trace)
    header = ["step", "$S_{1j}$", "$m_1^{(j)}$", r"$\tilde P_{1j}$", r"$\alpha$",
              r"$\ell_1^{(j)}$", r"$\tilde O_1^{(j)}$"]
    rows = [[f"$j = {t['j'] + 1}$", _mat(t["S"]), _col(t["m"]), _mat(t["P"]), _col(t["alpha"]),
             _col(t["ell"]), _mat(t["O_tilde"])] for t in trace if t["i"] == 0]
    return _results.markdown_table(header, rows, "c" * len(header))


# ----------------------------------------------------------------------------- memory arithmetic
def table_tile_budget() -> str:
    """The forward tiles the kernel uses (``_fwd_configs``): shared memory for bf16 Q_i and
    ``stages`` copies of K_j, V_j against the H200's 228 KiB, and the fp32 S_ij and Õ_i as
    registers a thread against the limit: 255, or the tile's cap (``maxnreg``)."""
    from kernelnotes.attention import kernel

    rows = []
    for d in (64, 128, 256):
        for c in kernel._fwd_configs(d):
            Br, Bc, s, w = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages, c.num_warps
            smem = (Br + 2 * s * Bc) * d * 2  # Q_i once, K_j and V_j once per stage, bf16
            regs = (Br * Bc + Br * d) // (32 * w)  # fp32 S_ij and Õ_i over 32 w threads
            cap = c.maxnreg or 255  # maxnreg: the compiler may use no more a thread
            rows.append([f"{Br} × {Bc}", d, f"{s}, {w}", f"{smem / 1024:.0f}",
                         f"{smem / H200_SMEM:.2f}", f"{regs} ({cap})",
                         "yes" if smem <= H200_SMEM and regs <= cap else "no"])
    return _results.markdown_table(
        ["$B_r \\times B_c$", "$d$", "stages, warps", "shared KiB", "of 228 KiB",
         "fp32 $S$, $\\tilde O$ registers (limit)", "fits"], rows)


def table_hbm_traffic() -> str:
    """HBM bytes of the standard three-pass attention and of the FA2 forward, one head, bf16."""
    rows = []
    for d in (64, 128):
        Br = ref.largest_tile(H200_SMEM, d)
        for N in (1024, 4096, 16384, 65536):
            std, fa = ref.hbm_bytes_standard(N, d), ref.hbm_bytes_flash(N, d, Br)
            rows.append([d, N, Br, f"{std / 2**20:,.1f}", f"{fa / 2**20:,.1f}", f"{std / fa:.1f}x"])
    return _results.markdown_table(
        ["$d$", "$N$", "$B_r$ (largest that fits)", "standard MiB", "FA2 MiB", "standard / FA2"],
        rows)


def measured_peak_bytes(Ns=(128, 256, 512, 1024, 2048), d=64, B=64):
    """Peak bytes NumPy allocates (tracemalloc) in naive vs tiled attention, float64, one head."""
    rng = np.random.default_rng(0)
    out = {"naive": [], "flash": []}
    for N in Ns:
        Q, K, V = (rng.standard_normal((N, d)) for _ in range(3))
        for name, fn in (("naive", functools.partial(ref.attention_naive, Q, K, V)),
                         ("flash", functools.partial(ref.flash_attention_forward, Q, K, V, B, B))):
            tracemalloc.start()
            fn()
            out[name].append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    return np.array(Ns), out


# ----------------------------------------------------------------------------- figures
def figure_tiling():
    """Q row tiles, K/V column tiles and the S grid with the causal tiles: skipped, masked, full."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    T = 6
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.set_xlim(-3.2, T + 3.0)
    ax.set_ylim(T + 2.4, -0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    for i in range(T):
        for j in range(T):
            color = "#d9d9d9" if j > i else ("#f4a261" if j == i else "#8ecae6")
            ax.add_patch(Rectangle((j, i), 1, 1, fc=color, ec="white", lw=2))
            if j < i:
                ax.text(j + 0.5, i + 0.5, "full", ha="center", va="center", fontsize=7)
            elif j == i:
                ax.text(j + 0.5, i + 0.5, "mask", ha="center", va="center", fontsize=7)
    ax.add_patch(Rectangle((0, 3), T, 1, fill=False, ec="k", lw=2.5))
    ax.add_patch(Rectangle((-2.2, 3), 1.4, 1, fc="#2a9d8f", ec="k"))
    ax.text(-1.5, 3.5, "$Q_i$", ha="center", va="center", color="white")
    for i in range(T):
        ax.add_patch(Rectangle((-2.2, i), 1.4, 1, fill=False, ec="#2a9d8f"))
    for j in range(T):
        ax.add_patch(Rectangle((j, T + 0.4), 1, 1.4, fc="#e9c46a" if j <= 3 else "white", ec="k"))
    ax.text(T / 2, T + 2.2, "$K_j, V_j$ streamed through on-chip memory ($j = 1 \\dots T_c$)",
            ha="center", va="center", fontsize=9)
    ax.text(-1.5, -0.15, "$Q$ tiles", ha="center", va="bottom", fontsize=9)
    ax.text(T / 2, -0.15, "$S = Q K^T$ in $B_r \\times B_c$ tiles (never stored)", ha="center",
            va="bottom", fontsize=9)
    ax.annotate("one program:\nquery tile $i$,\nloop over $j$", xy=(T, 3.5), xytext=(T + 0.5, 3.5),
                fontsize=8, ha="left", va="center", arrowprops=dict(arrowstyle="->"))
    ax.text(T + 0.5, 1.0, "grey: skipped\n(future keys)", fontsize=8, va="center")
    return fig


def figure_memory():
    """Measured peak memory of the NumPy references as N grows."""
    import matplotlib.pyplot as plt

    Ns, peak = measured_peak_bytes()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.loglog(Ns, np.array(peak["naive"]) / 2**20, "o-", label="standard (S, P materialized)")
    ax.loglog(Ns, np.array(peak["flash"]) / 2**20, "s-", label="FA2 tiled, $B_r = B_c = 64$")
    ax.set_xlabel("sequence length $N$ ($d = 64$, float64, one head)")
    ax.set_ylabel("peak allocated MiB (tracemalloc)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def _bench():
    try:
        return _results.load("attention")
    except FileNotFoundError:
        return None


def figure_tflops():
    """TFLOP/s vs N from the committed H200 results (a placeholder until they exist)."""
    import matplotlib.pyplot as plt

    data = _bench()
    fig, axes = plt.subplots(2, 4, figsize=(12, 5.5), sharex=True)
    if data is None:
        fig.clear()
        fig.text(0.5, 0.5, "Results pending: run `python -m benchmarks attention` on a GPU",
                 ha="center", va="center")
        return fig
    rows = [r for r in data["rows"] if "tflops" in r]
    styles = {"triton_fa2": "o-", "triton_fa2_atomic": "d-", "sdpa_flash": "s--",
              "sdpa_cudnn": "^--", "naive": "x:"}
    for a, (pass_, causal) in enumerate([("fwd", False), ("fwd", True), ("bwd", False),
                                         ("bwd", True)]):
        for b, D in enumerate((64, 128)):
            ax = axes[b, a]
            for impl, style in styles.items():
                pts = sorted((r["N"], r["tflops"]) for r in rows if r["impl"] == impl
                             and r["D"] == D and r["pass"] == pass_ and r["causal"] == causal)
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{pass_}, D={D}, {'causal' if causal else 'non-causal'}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if a == 0:
                ax.set_ylabel("TFLOP/s")
            if b == 1:
                ax.set_xlabel("N")
    handles = {}
    for ax in axes.flat:
        ax.set_ylim(bottom=0)
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.suptitle(f"bf16, 16 heads, batch x N = 65536 - {data['meta']['gpu']}, "
                 f"{data['meta']['date'][:10]}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    return fig


def figure_gpu_memory():
    """Peak extra memory of a training forward (output + what backward keeps) on the GPU."""
    import matplotlib.pyplot as plt

    data = _bench()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    rows = [] if data is None else [r for r in data["rows"] if "fwd_peak_mib" in r
                                    and r["pass"] == "bwd" and not r["causal"] and r["D"] == 128]
    if not rows:
        fig.clear()
        fig.text(0.5, 0.5, "Results pending: run `python -m benchmarks attention` on a GPU",
                 ha="center", va="center")
        return fig
    for impl, style in (("naive", "x:"), ("sdpa_flash", "s--"), ("triton_fa2", "o-")):
        pts = sorted((r["N"], r["fwd_peak_mib"] / r["B"]) for r in rows if r["impl"] == impl)
        if pts:
            ax.loglog(*zip(*pts, strict=True), style, base=2, label=impl)
    ax.set_xlabel("N (bf16, 16 heads, D = 128)")
    ax.set_ylabel("MiB per sequence")
    ax.set_title(f"{data['meta']['gpu']}, {data['meta']['date'][:10]}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


# ----------------------------------------------------------------------------- Hopper timeline
def fa3_schedule(n_tiles=4, gemm=1.0, softmax=1.3, load=0.6, stages=3):
    """A schematic schedule (not measured) of one program of the Hopper forward (hopper.py with
    intra-warpgroup overlap): the producer's TMA loads, the two consumer warpgroups' softmaxes
    and the wgmma on the tensor cores, in made-up units (a GEMM takes `gemm`).

    The rules are the kernel's: warpgroups take strictly alternating turns; a turn k issues
    S_k = Q K_k^T (k < n_tiles) and then P_{k-1} V_{k-1} (k >= 1), which queue on the tensor
    cores (one GEMM at a time, in issue order); the warpgroup passes the turn once both are
    issued, runs the softmax of S_k when S_k is done, and releases stage (k - 1) % stages when
    P_{k-1} V_{k-1} is done. The producer loads Q for each warpgroup, then K_j and V_j one after
    the other, K_j once both warpgroups have released the stage's previous tile.

    Returns [(lane, start, end, label, wg)], lane in {"tma", "wg0", "wg1", "tc"}; wg is the
    warpgroup a block belongs to (None for loads of K and V, which both read).
    """
    events = []
    q_end = []
    t = 0.0
    for wg in (0, 1):  # each warpgroup's own query tile
        events.append(("tma", t, t + load, f"$Q^{{({wg})}}$", wg))
        t += load
        q_end.append(t)
    producer_free = t
    k_landed, v_landed = {}, {}
    released = {0: {}, 1: {}}  # released[wg][j]: when wg arrived on tile j's `empty`

    def landed(j):  # lazily: tile j's loads need tile j - stages released, an earlier turn
        nonlocal producer_free
        if j not in k_landed:
            free = max((released[w][j - stages] for w in (0, 1)), default=0.0) \
                if j >= stages else 0.0
            k0 = max(producer_free, free)
            events.append(("tma", k0, k0 + load, f"$K_{j}$", None))
            events.append(("tma", k0 + load, k0 + 2 * load, f"$V_{j}$", None))
            k_landed[j], v_landed[j] = k0 + load, k0 + 2 * load
            producer_free = k0 + 2 * load
        return k_landed[j], v_landed[j]

    tc_free = 0.0
    ready = list(q_end)  # when each warpgroup can take its next turn
    passed = 0.0  # when the other warpgroup passed the turn
    for k in range(n_tiles + 1):
        for wg in (0, 1):
            issue = max(ready[wg], passed)
            if k < n_tiles:
                issue = max(issue, landed(k)[0])
            if k >= 1:
                issue = max(issue, landed(k - 1)[1])
            events.append(("issue", issue, issue, "", wg))
            passed = issue
            s_end = pv_end = issue
            if k < n_tiles:
                start = max(issue, tc_free)
                s_end = tc_free = start + gemm
                events.append(("tc", start, s_end, f"$S_{k}$", wg))
            if k >= 1:
                start = max(issue, tc_free)
                pv_end = tc_free = start + gemm
                events.append(("tc", start, pv_end, f"$P_{k - 1}V_{k - 1}$", wg))
                released[wg][k - 1] = pv_end
            sm_end = s_end
            if k < n_tiles:
                sm_end = s_end + softmax
                events.append((f"wg{wg}", s_end, sm_end, f"softmax $S_{k}$", wg))
            ready[wg] = max(sm_end, pv_end)
    return events


def figure_fa3_timeline():
    """The schematic (not measured) timeline of fa3_schedule: loads run ahead, the warpgroups'
    GEMMs alternate on the tensor cores, each softmax runs under the other warpgroup's GEMMs."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = fa3_schedule()
    lanes = {"tma": 3, "wg0": 2, "wg1": 1, "tc": 0}
    names = ["tensor cores\n(wgmma)", "warpgroup 1", "warpgroup 0", "producer\n(TMA)"]
    gemm = {0: "#1d5f8a", 1: "#c4581b"}  # warpgroup 0 blue, warpgroup 1 orange
    soft = {0: "#9cc7e4", 1: "#f3b48a"}
    end = max(e for _, _, e, _, _ in events)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    for lane, s, e, label, wg in events:
        if lane == "issue":  # the warpgroup takes its turn and issues its wgmma
            ax.plot([s], [lanes[f"wg{wg}"] + 0.36], marker="v", ms=5, color=gemm[wg])
            continue
        if lane == "tma":
            color, text = ("#b7b7b7" if wg is None else soft[wg]), "k"
        elif lane == "tc":
            color, text = gemm[wg], "white"
        else:
            color, text = soft[wg], "k"
        ax.barh(lanes[lane], e - s, left=s, height=0.6, color=color, edgecolor="white", lw=1)
        ax.text((s + e) / 2, lanes[lane], label, ha="center", va="center", fontsize=7,
                color=text)
    ax.set_yticks(range(4), names, fontsize=8)
    ax.set_xticks([])
    ax.set_xlim(0, end + 0.1)
    ax.set_ylim(-0.5, 3.6)
    ax.set_xlabel("time (schematic)", fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Patch(color=gemm[0], label="warpgroup 0: GEMMs"),
               Patch(color=soft[0], label="warpgroup 0: softmax, Q load"),
               Patch(color=gemm[1], label="warpgroup 1: GEMMs"),
               Patch(color=soft[1], label="warpgroup 1: softmax, Q load"),
               Patch(color="#b7b7b7", label="TMA load of K or V"),
               plt.Line2D([], [], ls="", marker="v", ms=5, color="k",
                          label="takes the turn, issues its wgmma")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3,
              fontsize=7.5, frameon=False)
    return fig


def _tflops(data) -> dict:
    """{(D, N, causal, pass): {impl: TFLOP/s}} of a results file."""
    t: dict = {}
    for r in data["rows"]:
        if "tflops" in r:
            t.setdefault((r["D"], r["N"], r["causal"], r["pass"]), {})[r["impl"]] = r["tflops"]
    return t


def shortfalls(data=None) -> list:
    """[(pass, D, N, causal, peer, ratio, target)] for every target of this kernel that the
    committed results miss (the targets apply at N >= 4096)."""
    data = _bench() if data is None else data
    out = []
    for (D, N, causal, pass_), v in sorted(_tflops(data).items()):
        for (p_pass, peer), target in TARGETS.items():
            if p_pass == pass_ and N >= 4096 and peer in v and "triton_fa2" in v:
                r = v["triton_fa2"] / v[peer]
                if r < target:
                    out.append((pass_, D, N, causal, peer, r, target))
    return out


def _ratio_cell(r: float, target: float | None) -> str:
    """'1.43x ✓', or '1.396x (< 1.4)' with a third digit where two would round up to the target."""
    if target is None:
        return f"{r:.2f}x"
    if r >= target:
        return f"{r:.2f}x\u00a0✓"  # a no-break space: the mark stays beside its ratio
    return f"{r:.3f}x (< {target})" if round(r, 2) >= target else f"{r:.2f}x (< {target})"


def table_performance() -> str:
    """TFLOP/s of every implementation and the issue's ratios, from the committed results.
    The targets are this kernel's (the default, deterministic backward); the fused backward's
    ratio is shown without one."""
    data = _bench()
    if data is None:
        return PENDING
    impls = ["triton_fa2", "triton_fa2_atomic", "sdpa_flash", "sdpa_cudnn", "naive"]
    rows = []
    for (D, N, causal, pass_), v in sorted(_tflops(data).items(),
                                           key=lambda kv: (kv[0][3] != "fwd", kv[0])):
        cells = [f"{v[i]:.0f}" if i in v else "-" for i in impls]
        ratio = []
        for ours, p in (("triton_fa2", "sdpa_flash"), ("triton_fa2", "sdpa_cudnn"),
                        ("triton_fa2_atomic", "sdpa_flash")):
            target = TARGETS.get((pass_, p)) if N >= 4096 and ours == "triton_fa2" else None
            ratio.append(_ratio_cell(v[ours] / v[p], target) if ours in v and p in v else "-")
        rows.append([pass_, D, N, "yes" if causal else "no", *cells, *ratio])
    table = _results.markdown_table(
        ["pass", "D", "N", "causal", "this kernel", "fused bwd", "SDPA flash", "SDPA cuDNN",
         "naive", "vs flash", "vs cuDNN", "fused vs flash"], rows)
    return table + "\n\n" + _results.provenance(data["meta"])


_PEER_NAMES = {"sdpa_flash": "SDPA's FlashAttention-2 backend", "sdpa_cudnn": "cuDNN"}


def _point(key) -> str:
    D, N, causal, pass_ = key
    what = {"fwd": "forward", "bwd": "backward"}[pass_]
    return f"the {'causal ' if causal else ''}{what} at $D = {D}$, $N = {N}$"


def target_margins(data=None) -> dict:
    """{((D, N, causal, pass), peer): ratio / target - 1} for every target point of this kernel
    (D in {64, 128}, N >= 4096) in the committed results."""
    data = _bench() if data is None else data
    return {(key, peer): v["triton_fa2"] / v[peer] / target - 1
            for key, v in _tflops(data).items() for (p, peer), target in TARGETS.items()
            if p == key[3] and key[0] in (64, 128) and key[1] >= 4096
            and peer in v and "triton_fa2" in v}


def table_performance_summary() -> str:
    """The paragraph under the performance table, written from the committed results: how many
    targets are met, those with under 2% to spare, the ranges against cuDNN at N >= 4096, and
    the range against naive attention."""
    data = _bench()
    if data is None:
        return PENDING
    t = _tflops(data)
    margins = target_margins(data)
    ratio = lambda key, peer: t[key]["triton_fa2"] / t[key][peer]  # noqa: E731

    def said(items):
        return "; ".join(f"{_point(key)}, {ratio(key, peer):.3f}x {_PEER_NAMES[peer]} against "
                         f"{TARGETS[key[3], peer]}x" for key, peer in items)

    missed = sorted(k for k, m in margins.items() if m < 0)
    tight = sorted(k for k, m in margins.items() if 0 <= m < 0.02)
    out = [f"Every one of the {len(margins)} targets is met." if not missed else
           f"{len(margins) - len(missed)} of the {len(margins)} targets are met; missed: "
           f"{said(missed)}."]
    if tight:
        out.append(f"With less than 2% to spare, where another run could fall under the line: "
                   f"{said(tight)}.")

    def span(D, pass_):
        r = [ratio(k, "sdpa_cudnn") for k in t if (k[0], k[3]) == (D, pass_) and k[1] >= 4096
             and "sdpa_cudnn" in t[k] and "triton_fa2" in t[k]]
        return f"{min(r):.2f}x to {max(r):.2f}x" if r else "not measured"

    bwd = [ratio(k, "sdpa_cudnn") for k in t if k[3] == "bwd" and k[0] in (64, 128)
           and k[1] >= 4096 and "sdpa_cudnn" in t[k] and "triton_fa2" in t[k]]
    out.append(f"Beside cuDNN at $N \\ge 4096$ the forward runs at {span(64, 'fwd')} of its speed "
               f"at $D = 64$ and {span(128, 'fwd')} at $D = 128$"
               + (f", the backward at {min(bwd):.2f}x to {max(bwd):.2f}x." if bwd else "."))
    naive = {k: v["triton_fa2"] / v["naive"] for k, v in t.items()
             if "naive" in v and "triton_fa2" in v}
    if naive:
        slow, fast = min(naive, key=naive.get), max(naive, key=naive.get)
        ns = sorted({k[1] for k in naive})
        out.append(f"Against naive attention, timed at $N = {' and '.join(map(str, ns))}$ only, "
                   f"the kernel is {naive[slow]:.1f}x ({_point(slow)[4:]}"
                   f"{'' if slow[2] else ', no mask'}) to {naive[fast]:.0f}x "
                   f"({_point(fast)[4:]}) faster.")
    return " ".join(out)


def table_fused_backward() -> str:
    """The "What did not help" item on the fused (atomic dQ) backward, its speed relative to the
    default backward read from the committed results."""
    data = _bench()
    fused = [] if data is None else [v["triton_fa2_atomic"] / v["triton_fa2"]
                                     for k, v in _tflops(data).items()
                                     if k[3] == "bwd" and "triton_fa2_atomic" in v]
    speed = (f"it ran at {min(fused):.2f}x to {max(fused):.2f}x of the default backward's speed "
             "at every point of the table" if fused else "its speed is pending a GPU run")
    return (f"- **The fused backward.** Adding $dQ$ with atomics saves two of seven tile matmuls, "
            f"but {speed}, and its result is not repeatable; it stays an option, not the default.")

