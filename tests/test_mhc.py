"""mHC: Triton mhc_pre / mhc_pre_from_mixes / mhc_post against the float64 NumPy reference.

Inputs are consistent (dot_mix and sqrsum are computed from the residual they go with, not
random), logits are O(1) so that Sinkhorn has work to do, and H does not divide BLOCK_H.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kernelnotes._testing import UNIT_ROUNDOFF, poison_allocations, rel_err
from kernelnotes.mhc import kernel as K
from kernelnotes.mhc import reference as R
from kernelnotes.mhc.kernel import _round_bf16, mhc_post, mhc_pre, mhc_pre_from_mixes, split_fn
from kernelnotes.mhc.torch_reference import mhc_post_torch, mhc_pre_torch
from tests._machine import DEVICE, ON_GPU
from tests._offline import compiled_offline

U32, U_BF16 = UNIT_ROUNDOFF["float32"], UNIT_ROUNDOFF["bfloat16"]
# Relative-norm tolerances per output, with why:
# - bf16 outputs (layer_input, X_{l+1}): one rounding to bf16, at most 2^-9 relative per element
#   when the fp32 value is right; the bound is u_bf16 = 2^-8 (FlashInfer's bar is 6e-3).
# - post/comb from given fp32 mixes: a handful of fp32 operations per entry and 40 Sinkhorn
#   divisions, each contracting the error, but the GPU's exp is ex2.approx (2 ulp) of a
#   product x * log2(e) whose rounding grows with the logit; 64 u.
# - post/comb through the projection: fn is carried as two bf16 parts (2^-17 relative) and
#   the K = 4H products are summed in fp32 (sqrt(K) u); 1e-4, still 60x under FlashInfer's bar.
TOL_BF16 = U_BF16
TOL_GATES = 64 * U32
TOL_GATES_PROJECTED = 1e-4

if ON_GPU:
    PRE_CFG = {"project": {"BLOCK_T": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
               "fuse": {"BLOCK_T": 2, "BLOCK_H": 1024, "num_warps": 4}}
    STREAM_CFG = {"BLOCK_T": 2, "BLOCK_H": 1024, "num_warps": 4}
else:  # the interpreter: small tiles, so that T = 5, 33 and H = 72, 100 leave masked tails
    PRE_CFG = {"project": {"BLOCK_T": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1},
               "fuse": {"BLOCK_T": 4, "BLOCK_H": 64, "num_warps": 4}}
    STREAM_CFG = {"BLOCK_T": 4, "BLOCK_H": 64, "num_warps": 4}

# (T, H): CPU sizes always; the full sizes of the issue on the GPU only
SHAPES = [(1, 64), (5, 100), (33, 72)]
GPU_SHAPES = [(8192, 4096), (8192, 7168), (1024, 7168), (128, 4096), (33, 1000), (3, 7168)]
ALL_SHAPES = SHAPES + [pytest.param(*s, marks=pytest.mark.gpu) for s in GPU_SHAPES]


def make_inputs(T, H, seed=0, *, logit_scale=1.0):
    """residual [T, 4, H] bf16 and fn, scale, base with O(logit_scale) logits."""
    g = torch.Generator().manual_seed(seed)
    K = 4 * H
    residual = (torch.randn(T, 4, H, generator=g) * (1 + 0.1 * torch.arange(4))[:, None]).bfloat16()
    fn = torch.randn(24, K, generator=g) / K**0.5  # mixes ~ N(0, 1): x_hat has RMS 1
    scale = logit_scale * (1 + 0.1 * torch.randn(3, generator=g))
    base = 0.3 * torch.randn(24, generator=g)
    return [t.to(DEVICE) for t in (residual, fn, scale, base)]


def f64(t):
    return t.detach().cpu().double().numpy()


def check_pre(got, ref, tol_gates):
    li, post, comb = got
    assert li.dtype == torch.bfloat16 and post.dtype == comb.dtype == torch.float32
    assert post.shape == ref[1].shape and comb.shape == ref[2].shape and li.shape == ref[0].shape
    errs = [rel_err(g, r) for g, r in zip(got, ref, strict=True)]
    assert errs[0] < TOL_BF16, errs
    assert errs[1] < tol_gates and errs[2] < tol_gates, errs


@pytest.mark.parametrize("T,H", ALL_SHAPES)
def test_mhc_pre_matches_reference(T, H):
    residual, fn, scale, base = make_inputs(T, H, seed=T + H)
    got = mhc_pre(residual, fn, scale, base, config=PRE_CFG)
    ref = R.mhc_pre(f64(residual), f64(fn), f64(scale), f64(base))
    check_pre(got, ref, TOL_GATES_PROJECTED)


@pytest.mark.parametrize("T,H", ALL_SHAPES)
@pytest.mark.parametrize("splits", [1, 3])
def test_mhc_pre_from_mixes_matches_reference(T, H, splits):
    residual, fn, scale, base = make_inputs(T, H, seed=T * H + splits)
    dot, sq = R.project_split_k(f64(residual), f64(fn), splits)  # consistent with the residual
    dot_t = torch.from_numpy(dot).float().to(DEVICE)
    sq_t = torch.from_numpy(sq).float().to(DEVICE)
    if splits == 1:
        dot_t, sq_t = dot_t[0], sq_t[0]  # the [T, 24] / [T] form
    got = mhc_pre_from_mixes(dot_t, sq_t, residual, scale, base, config=STREAM_CFG)
    # the reference sees the fp32-rounded mixes the kernel sees
    ref = R.mhc_pre_from_mixes(f64(dot_t), f64(sq_t), f64(residual), f64(scale), f64(base))
    check_pre(got, ref, TOL_GATES)


@pytest.mark.parametrize("T,H", ALL_SHAPES)
def test_mhc_post_matches_reference(T, H):
    residual, fn, scale, base = make_inputs(T, H, seed=7 + T)
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, H, generator=g).bfloat16().to(DEVICE)
    # FlashInfer's test uses unnormalised post/comb: any real numbers must work
    post = torch.randn(T, 4, generator=g).to(DEVICE)
    comb = torch.randn(T, 4, 4, generator=g).to(DEVICE)
    out = mhc_post(x, residual, post, comb, config=STREAM_CFG)
    assert out.shape == residual.shape and out.dtype == torch.bfloat16
    assert rel_err(out, R.mhc_post(f64(x), f64(residual), f64(post), f64(comb))) < TOL_BF16


@pytest.mark.parametrize("T,H", [(5, 100), pytest.param(8192, 7168, marks=pytest.mark.gpu)])
def test_issue_bar_flashinfer_tolerances(T, H):
    """The issue's bar, FlashInfer's test tolerances: rel-norm < 0.006, then elementwise."""
    residual, fn, scale, base = make_inputs(T, H, seed=1)
    li, post, comb = mhc_pre(residual, fn, scale, base, config=PRE_CFG)
    r_li, r_post, r_comb = (torch.from_numpy(a) for a in
                            R.mhc_pre(f64(residual), f64(fn), f64(scale), f64(base)))
    for got, ref in ((li, r_li), (post, r_post), (comb, r_comb)):
        assert rel_err(got, ref) < 0.006
    torch.testing.assert_close(post.cpu().double(), r_post, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(comb.cpu().double(), r_comb, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(li.cpu().double(), r_li, atol=1e-2, rtol=1e-2)
    x = li  # a stand-in sublayer output
    out = mhc_post(x, residual, post, comb, config=STREAM_CFG)
    r_out = R.mhc_post(f64(x), f64(residual), f64(post), f64(comb))
    assert rel_err(out, r_out) < 0.005
    torch.testing.assert_close(out.cpu().double(), torch.from_numpy(r_out), atol=1e-2, rtol=1e-2)


def test_outputs_fully_written(monkeypatch):
    """Every output element is written: allocate all outputs NaN-poisoned."""
    poison_allocations(monkeypatch)
    T, H = 7, 100
    residual, fn, scale, base = make_inputs(T, H)
    outs = mhc_pre(residual, fn, scale, base, config=PRE_CFG, num_splits=3)
    outs += (mhc_post(outs[0], residual, outs[1], outs[2], config=STREAM_CFG),)
    # the forward token walk (REVERSE = False) with the [T, 24] form of the mixes (S = 1)
    flat = residual.flatten(1).float()
    dot, sq = (flat @ fn.T).contiguous(), flat.square().sum(-1).contiguous()
    outs += mhc_pre_from_mixes(dot, sq, residual, scale, base, config=STREAM_CFG)
    outs += (split_fn(fn),)
    for o in outs:
        assert not torch.isnan(o).any()


def test_metadata_programs_alone_leave_layer_input_as_given():
    """The big-fuse launch given a layer_input that another kernel wrote (the one-pass design
    study's path): C_l and comb as the whole launch gives them, layer_input not touched."""
    from kernelnotes.mhc import kernel

    T, H = 33, 72
    residual, fn, scale, base = make_inputs(T, H)
    flat = residual.flatten(1).float()
    dot, sq = (flat @ fn.T).contiguous(), flat.square().sum(-1).contiguous()
    whole = mhc_pre_from_mixes(dot, sq, residual, scale, base, config=STREAM_CFG)
    given = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    li, post, comb = kernel._fuse(dot[None], sq[None], residual, scale, base, 1e-6, 1e-6, 1e-6,
                                  2.0, 20, None, reverse=False, layer_input=given)
    assert li is given and li.isnan().all()
    assert torch.equal(post, whole[1]) and torch.equal(comb, whole[2])


@pytest.mark.parametrize("T,H", [(5, 100), pytest.param(8192, 7168, marks=pytest.mark.gpu)])
def test_split_fn_once_gives_the_same_bits(T, H):
    """fn split once by split_fn (as a model does when its weights load) and passed to mhc_pre:
    the same kernels on the same parts, so the same bits as splitting on every call."""
    residual, fn, scale, base = make_inputs(T, H, seed=3)
    parts = split_fn(fn)
    assert parts.shape == (2, 24, 4 * H) and parts.dtype == torch.bfloat16
    per_call = mhc_pre(residual, fn, scale, base, config=PRE_CFG)
    for a, b in zip(per_call, mhc_pre(residual, parts, scale, base, config=PRE_CFG), strict=True):
        assert torch.equal(a, b)


def test_split_fn_parts_carry_fn_to_2_to_the_minus_16():
    """hi is fn rounded to bf16 (ties to even, as torch's cast), lo the rest, exact in fp32,
    rounded again: |fn - hi - lo| <= 2^-8 |fn - hi| <= 2^-16 |fn| (u_bf16 = 2^-8), for zeros,
    signs and extreme exponents too."""
    g = torch.Generator().manual_seed(5)
    fn = torch.randn(24, 4 * 50, generator=g) * torch.logspace(-30, 30, 200)[None, :]
    fn[0, :4] = torch.tensor([0.0, -0.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8])  # + two exact ties
    hi, lo = split_fn(fn.to(DEVICE)).cpu().double()
    assert torch.equal(hi, fn.bfloat16().double())
    assert torch.equal(torch.signbit(hi[0, :2]), torch.tensor([False, True]))
    ties = torch.tensor([0.0, 0.0, 2.0**-8, -(2.0**-8)], dtype=torch.float64)  # to 1 and 1 + 2^-6
    assert torch.equal(lo[0, :4], ties)
    err = (fn.double() - hi - lo).abs()
    assert (err <= 2.0**-16 * fn.double().abs()).all()
    assert ((fn.double() - hi).abs() > 2.0**-16 * fn.double().abs()).any()  # lo = 0 would fail


def test_split_k_does_not_change_the_result():
    residual, fn, scale, base = make_inputs(9, 100)
    one = mhc_pre(residual, fn, scale, base, config=PRE_CFG, num_splits=1)
    many = mhc_pre(residual, fn, scale, base, config=PRE_CFG, num_splits=3)
    for a, b in zip(one, many, strict=True):  # only the order of the fp32 sums over K differs
        assert rel_err(a, b) < (TOL_BF16 if a.dtype == torch.bfloat16 else TOL_GATES)


def test_zero_residual():
    """sqrsum = 0: rstd = 1/sqrt(eps), mixes 0, so the gates are their static parts."""
    T, H = 3, 64
    residual, fn, scale, base = make_inputs(T, H)
    residual.zero_()
    li, post, comb = mhc_pre(residual, fn, scale, base, config=PRE_CFG)
    assert torch.all(li == 0)
    ref_pre, ref_post, ref_comb = R.gates(np.zeros(24), f64(scale), f64(base))
    assert rel_err(post, np.broadcast_to(ref_post, (T, 4))) < TOL_GATES
    assert rel_err(comb, np.broadcast_to(ref_comb, (T, 4, 4))) < TOL_GATES


# numpy's exp(-v) overflows to inf for v < -88, as the GPU's does; the sigmoid is then exactly 0
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_saturated_logits_stay_finite():
    """Logits of +-60: exp would overflow without the row max; sigmoid saturates to 0/1."""
    T, H = 4, 64
    residual, fn, scale, base = make_inputs(T, H, logit_scale=60.0)
    li, post, comb = mhc_pre(residual, fn, scale, base, config=PRE_CFG)
    assert all(torch.isfinite(t).all() for t in (li, post, comb))
    ref = R.mhc_pre(f64(residual), f64(fn), f64(scale), f64(base))
    # logits of size 60 amplify a relative mix error by 60 (d exp(60 m) / exp = 60 dm)
    check_pre((li, post, comb), ref, 60 * TOL_GATES_PROJECTED)


def test_kernel_comb_is_doubly_stochastic():
    """Columns of comb (rows of B) sum to 1 up to eps; rows to 1 after 20 iterations."""
    residual, fn, scale, base = make_inputs(17, 64)
    _, _, comb = mhc_pre(residual, fn, scale, base, config=PRE_CFG)
    comb = f64(comb)
    assert (comb >= 0).all()
    assert np.abs(comb.sum(1) - 1).max() < 4 * 1e-6 + 64 * U32  # column sums: the last step
    assert np.abs(comb.sum(2) - 1).max() < 1e-3  # row sums: converged, not exact


@triton.jit
def _round_bf16_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, _round_bf16(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


def test_round_bf16_is_torchs_cast_bit_for_bit():
    """The kernels' hand rounding against torch's fp32 -> bf16 cast (nearest, ties to even, NaN
    kept): ties both ways, the overflow to inf, subnormals, signed zeros, and every NaN pattern,
    including the GPU's 0x7FFFFFFF."""
    special = [0x7FFFFFFF, 0x7FC00000, 0xFFFFFFFF, 0x7F800001, 0xFF800001, 0x7F800000, 0xFF800000,
               0x7F7FFFFF, 0xFF7FFFFF, 0x3F808000, 0x3F818000, 0x3F808001, 0x00000001, 0x00008000,
               0x80018000, 0x80000000, 0x00000000]
    bits = np.concatenate([np.array(special, dtype=np.uint32),
                           np.random.default_rng(0).integers(0, 2**32, 1000, dtype=np.uint32)])
    x = torch.from_numpy(bits.view(np.float32)).to(DEVICE)
    y = torch.full_like(x, 123.0)
    _round_bf16_probe[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    want = x.bfloat16().float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(y), nan)
    assert torch.equal(y[~nan].view(torch.int32), want[~nan].view(torch.int32))


def test_nan_and_inf_in_the_residual_reach_the_bf16_outputs():
    """Non-finite inputs are passed on, not rounded away: the bf16 rounding by hand must keep the
    GPU's NaN (0x7FFFFFFF, whose rounding carry would reach the sign bit) a NaN."""
    T, H = 3, 100
    residual, fn, scale, base = make_inputs(T, H)
    residual[1, 2, 5] = float("nan")
    residual[2, 0, 7] = float("inf")
    x = residual[:, 0].contiguous()
    x[0, 9] = float("nan")
    post = torch.rand(T, 4, device=DEVICE) + 0.5  # > 0: inf times a gate stays inf
    comb = torch.rand(T, 4, 4, device=DEVICE) + 0.1
    out = mhc_post(x, residual, post, comb, config=STREAM_CFG)
    bad = torch.zeros(T, 4, H, dtype=torch.bool, device=DEVICE)
    bad[1, :, 5] = bad[2, :, 7] = bad[0, :, 9] = True
    assert torch.isnan(out[1, :, 5]).all() and torch.isnan(out[0, :, 9]).all()
    assert (out[2, :, 7] == float("inf")).all()
    assert torch.isfinite(out[~bad]).all()
    # layer_input from finite mixes: pre > 0 weights every stream
    dot_mix = torch.randn(T, 24, device=DEVICE)
    sqrsum = torch.full((T,), 4.0 * H, device=DEVICE)
    li, post_mix, comb_mix = mhc_pre_from_mixes(dot_mix, sqrsum, residual, scale, base,
                                               config=STREAM_CFG)
    assert torch.isnan(li[1, 5]) and li[2, 7] == float("inf")
    keep = torch.ones(T, H, dtype=torch.bool, device=DEVICE)
    keep[1, 5] = keep[2, 7] = False
    assert torch.isfinite(li[keep]).all()
    assert torch.isfinite(post_mix).all() and torch.isfinite(comb_mix).all()


def test_post_accepts_column_post_mix():
    residual, *_ = make_inputs(3, 64)
    x = residual[:, 0].contiguous()
    post = torch.rand(3, 4, 1, device=DEVICE)
    comb = torch.rand(3, 4, 4, device=DEVICE)
    a = mhc_post(x, residual, post, comb, config=STREAM_CFG)
    b = mhc_post(x, residual, post[..., 0].contiguous(), comb, config=STREAM_CFG)
    assert torch.equal(a, b)


@pytest.mark.gpu
def test_autotuned_path_matches_fixed_config():
    residual, fn, scale, base = make_inputs(1024, 7168)
    tuned = mhc_pre(residual, fn, scale, base)
    # later calls skip the autotuner and launch the config it chose: the same bits
    for a, b in zip(tuned, mhc_pre(residual, fn, scale, base), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(tuned, mhc_pre(residual, fn, scale, base, config=PRE_CFG), strict=True):
        # other tiles sum the K = 28672 products in another order
        assert rel_err(a, b) < (TOL_BF16 if a.dtype == torch.bfloat16 else TOL_GATES_PROJECTED)
    x = residual[:, 1].contiguous()
    post, comb = torch.rand(1024, 4, device=DEVICE), torch.rand(1024, 4, 4, device=DEVICE)
    out = mhc_post(x, residual, post, comb)
    assert torch.equal(out, mhc_post(x, residual, post, comb))
    assert rel_err(out, mhc_post(x, residual, post, comb, config=STREAM_CFG)) < TOL_BF16


def test_run_tuned_tunes_a_bucket_once_then_launches_its_choice(monkeypatch):
    """_run_tuned with stand-ins for the autotuned kernel: the first T of a power-of-two bucket
    runs the autotuner; later T of the bucket launch the chosen config, on a grid of their own."""
    calls = []

    class Kernel:  # the jit function: kernel[grid](*args, **constexprs)
        def __getitem__(self, grid):
            return lambda *args, **consts: calls.append(("launch", grid, consts))

    class Tuned:  # the autotuner around it
        fn = Kernel()
        best_config = triton.Config({"BLOCK_T": 4}, num_warps=2)

        def __getitem__(self, grid):
            return lambda *args, **consts: calls.append(("tune", None, consts))

    monkeypatch.setattr(K, "_CHOSEN", {})
    tuned, x = Tuned(), torch.zeros(1)  # a CPU tensor: _launch takes the interpreter's path
    for T in (600, 1000, 1024, 1025):
        key = ("post", 64, K._tokens_key(T), x.device)
        K._run_tuned(tuned, lambda m, T=T: (triton.cdiv(T, m["BLOCK_T"]),), key, x, T, S_MAX=2)
    assert [c[0] for c in calls] == ["tune", "launch", "launch", "tune"]
    assert calls[0][2] == {"S_MAX": 2}
    assert calls[1][1:] == ((250,), {"S_MAX": 2, **Tuned.best_config.all_kwargs()})
    assert calls[2][1] == (256,)


@pytest.mark.parametrize("hooked", [False, True])
def test_direct_launch_calls_the_launcher_as_tritons_runner_does(hooked, monkeypatch):
    """_launch with stand-ins for a compiled kernel on a GPU: its first call goes through the jit
    launch; the second calls the compiled kernel's launcher itself, with exactly the arguments
    that this Triton's own runner (``CompiledKernel.__getitem__``) passes it for the same grid,
    stream and arguments, launch hooks included. Run by the suite on both machines, this checks
    the call against the CPU's current Triton and the GPU machine's 3.6 alike."""
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel

    runs = []

    class Compiled:  # what kernel[grid](...) returns: the compiled kernel, its handles loaded
        function, packed_metadata = "function handle", ("packed", "metadata")

        def _init_handles(self):
            pass

        def launch_metadata(self, grid, stream, *args):  # as CompiledKernel's: None unhooked
            return None if knobs.runtime.launch_enter_hook is None else (grid, stream, args)

        def run(self, *launcher_args):
            runs.append(launcher_args)

    compiled = Compiled()

    class Kernel:  # the jit function; its launch compiles, launches, returns the compiled kernel
        arg_names = ["x_ptr", "n", "BLOCK"]

        def __getitem__(self, grid):
            return lambda *args, **consts: compiled

    class Active:  # triton.runtime.driver.active, as the GPU machine's
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 0xC0FFEE

    class OnGpu:  # an argument on a CUDA device
        class device:
            type = "cuda"

    monkeypatch.setattr(K, "_COMPILED", {})
    monkeypatch.setattr(K, "driver", types.SimpleNamespace(active=Active()))
    hooks = (lambda meta: None, lambda meta: None) if hooked else (None, None)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hooks[0])
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", hooks[1])
    x = OnGpu()
    for _ in range(2):
        K._launch(Kernel(), (5, 3), ("stand-in",), (x, 7), {"BLOCK": 16})
    assert len(runs) == 1  # the first call was the jit launch
    CompiledKernel.__getitem__(compiled, (5, 3, 1))(x, 7, 16, stream=0xC0FFEE)
    assert runs[0] == runs[1]


@pytest.mark.gpu
def test_autotuner_runs_once_per_power_of_two_of_T(monkeypatch):
    """A new T in a power-of-two bucket already tuned launches the chosen tiles without another
    round of the autotuner, and its outputs are still fully written and right; the next bucket
    tunes again."""
    poison_allocations(monkeypatch)
    H = 1000  # a width no other test tunes, so that the first call below tunes its bucket
    tuned = (K._fuse_tuned, K._post_tuned)  # the projection has one tile: nothing to tune

    def call(T):
        residual, fn, scale, base = make_inputs(T, H, seed=T)
        got = mhc_pre(residual, fn, scale, base)
        ref = R.mhc_pre(f64(residual), f64(fn), f64(scale), f64(base))
        check_pre(got, ref, TOL_GATES_PROJECTED)
        x, post, comb = got
        out = mhc_post(x, residual, post, comb)
        assert rel_err(out, R.mhc_post(f64(x), f64(residual), f64(post), f64(comb))) < TOL_BF16
        return [len(t.cache) for t in tuned]  # the autotuner's rounds so far, per kernel

    assert K._tokens_key(600) == K._tokens_key(1000) == 1024 != K._tokens_key(1025)
    tuned_600 = call(600)
    assert call(1000) == tuned_600  # same bucket (and the same split count): no new round
    assert all(b > a for a, b in zip(tuned_600, call(1025), strict=True))


OUTPUTS = ("layer_input", "post_mix", "comb_mix", "mhc_post")


def assert_written_and_repeated(got, want, call: str) -> None:
    """``got`` (mhc_pre's three outputs and mhc_post's) holds no NaN, so no element of a poisoned
    allocation was left unwritten, and the same bits as ``want``; the message names the output."""
    for out, a, b in zip(OUTPUTS, got, want, strict=True):
        assert not a.isnan().any(), f"{call}: {out} has unwritten (NaN) elements"
        assert torch.equal(a, b), (
            f"{call}: {out} differs from the first call in {int((a != b).sum())} of {a.numel()} "
            f"elements, by up to {(a.float() - b.float()).abs().max().item():.3g}")


def _launch_config(config: triton.Config) -> dict:
    """A config of the autotuner's candidates as the launchers' ``config`` argument takes it."""
    return {**config.kwargs, "num_warps": config.num_warps}


# every tile the autotuner may pick on a GPU (the streaming kernels'), each beside the projection's
# one tile
AUTOTUNE_CANDIDATES = range(len(K.STREAM_CONFIGS))


@pytest.mark.gpu
@pytest.mark.parametrize("T,H", [(1000, 4096), (999, 4000)])
@pytest.mark.parametrize("i", AUTOTUNE_CANDIDATES)
def test_every_autotune_candidate_writes_everything_and_repeats(T, H, i, monkeypatch):
    """Whichever config the autotuner picks, every output element is written (NaN-poisoned
    allocations) and a second and third call give the same bits: the kernels hold no race."""
    poison_allocations(monkeypatch)
    project, stream = dict(K.PROJECT_TILE), _launch_config(K.STREAM_CONFIGS[i])
    residual, fn, scale, base = make_inputs(T, H)
    x = residual[:, 1].contiguous()
    post, comb = torch.rand(T, 4, device=DEVICE), torch.rand(T, 4, 4, device=DEVICE)
    first = None
    for call in range(3):
        got = (*mhc_pre(residual, fn, scale, base, config={"project": project, "fuse": stream}),
               mhc_post(x, residual, post, comb, config=stream))
        if first is None:
            first = got
        assert_written_and_repeated(got, first, f"call {call}")


@pytest.mark.gpu
def test_direct_launch_specialises_on_alignment(monkeypatch):
    # A launcher's first call of a shape goes through Triton's jit (which compiles for the
    # arguments' alignment); later calls launch that compiled kernel directly (kernel._launch).
    # A residual 2 bytes off 16-byte alignment needs a kernel without aligned vector loads: were
    # the cache to hand it the aligned one, the launch would fault or give other bits.
    poison_allocations(monkeypatch)  # an element no launch writes shows as NaN
    T, H = 1000, 4096
    residual, fn, scale, base = make_inputs(T, H)
    shifted = torch.empty(residual.numel() + 1, dtype=torch.bfloat16, device=DEVICE)[1:]
    shifted = shifted.view_as(residual).copy_(residual)
    assert shifted.data_ptr() % 16 and shifted.is_contiguous()
    x = residual[:, 1].contiguous()
    post, comb = torch.rand(T, 4, device=DEVICE), torch.rand(T, 4, 4, device=DEVICE)
    first = {}
    for call, (name, res) in enumerate([("aligned", residual), ("shifted", shifted)] * 3):
        got = (*mhc_pre(res, fn, scale, base), mhc_post(x, res, post, comb))
        assert_written_and_repeated(got, first.setdefault(name, got), f"call {call} ({name})")
    # the two compiled kernels may sum sum(x^2) in another order: close, not equal
    for a, b in zip(first["aligned"], first["shifted"], strict=True):
        assert rel_err(a, b) < (TOL_BF16 if a.dtype == torch.bfloat16 else TOL_GATES_PROJECTED)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H", [(1000, 4096), (8192, 7168), (777, 4000)])
def test_wide_projection_tile_gives_the_64_token_tiles_bits(T, H, monkeypatch):
    """Where its grid fills the GPU, mhc_pre projects with 128-token tiles (PROJECT_TILE_WIDE),
    elsewhere with 64-token ones. Both take the same K-splits and the same 128 columns a step, so
    dot_mix and sqrsum must have the same bits, written everywhere (NaN-poisoned allocations,
    T not a multiple of 128) and repeated from call to call."""
    poison_allocations(monkeypatch)
    residual, fn = make_inputs(T, H)[:2]
    w = K.split_fn(fn)
    S = 2
    got = {}
    for name in ("PROJECT_TILE", "PROJECT_TILE_WIDE"):
        config = {"project": dict(getattr(K, name)), "fuse": {}}
        first = K._project(residual, w, S, config)
        again = K._project(residual, w, S, config)
        for out, a, b in zip(("dot_mix", "sqrsum"), first, again, strict=True):
            assert not a.isnan().any(), f"{name}: {out} has unwritten (NaN) elements"
            assert torch.equal(a, b), f"{name}: {out} differs from call to call"
        got[name] = first
    for a, b in zip(got["PROJECT_TILE"], got["PROJECT_TILE_WIDE"], strict=True):
        assert torch.equal(a, b)


def test_wide_projection_tile_only_where_its_grid_fills_the_gpu():
    """_fills: one 128-token program an SM for each (token block, split) must cover FILL of the
    SMs; on an H200 (132 SMs) T = 8192 with two splits does (128 programs), T = 512 with the
    most splits does not (64)."""
    assert K._fills(8192, 2, 132) and K._fills(1024, 16, 132)
    assert not K._fills(512, 16, 132) and not K._fills(8192, 1, 132)
    assert K._fills(1000, 15, 132) == (8 * 15 >= K.FILL * 132)


@pytest.mark.gpu
def test_direct_launches_call_the_launch_hooks():
    """After its first call, mhc_pre launches its compiled kernels itself (kernel._launch), not
    through Triton's runner; a profiler's launch hook (Proton's) must still see every launch."""
    from triton import knobs

    residual, fn, scale, base = make_inputs(33, 256)
    mhc_pre(residual, fn, scale, base)  # compiles and caches the three kernels
    seen = []
    knobs.runtime.launch_enter_hook = lambda meta: seen.append(meta.get()["name"])
    try:
        mhc_pre(residual, fn, scale, base)
    finally:
        knobs.runtime.launch_enter_hook = None
    assert seen == ["_mhc_split_fn_kernel", "_mhc_project_kernel", "_mhc_pre_fuse_kernel"]


@pytest.mark.parametrize("tile", ["PROJECT_TILE", "PROJECT_TILE_WIDE"])
def test_projection_waits_for_its_mma_before_the_next_prefetch(tile):
    """The residual tile feeds the projection's MMA from shared memory and the sum of squares from
    registers. Triton's software pipeliner (3.6 on the GPU machine, and the current one) gives
    such a tile one buffer fewer than the tiles that feed only MMAs (triton-lang/triton#6691), so
    the slot a step reads is the one that the same step's prefetch refills. An MMA left in
    flight across that prefetch reads a half-overwritten tile: on the H200 the 128-token config
    (an autotune candidate then) summed differently from run to run. The kernel makes every step
    wait for its MMA; here, compiled for sm_90 without a GPU at each of the projection's tiles,
    the loop body's one MMA is waited for (``pendings = 0``) before the body's first prefetch.

    The same compile shows the buffers: the 64-token tile's (two of the residual's tiles, three
    of fn's) take 80 KiB, so two programs share an SM's 228 KiB; the wide tile's (three and
    four) take 160 KiB, one program an SM. Post 08 counts the bytes in flight from these."""
    code = f"TILE = {tile!r}\n" + r"""
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelnotes.mhc import kernel as K
sig = dict(x_ptr="*bf16", w_ptr="*bf16", dot_ptr="*fp32", sq_ptr="*fp32", T="i32", K="i32",
           K_SPLIT="i32", BLOCK_T="constexpr", BLOCK_K="constexpr", MMA_BF16="constexpr",
           PDL="constexpr")
aligned = [["tt.divisibility", 16]]  # the pointers, K and K_SPLIT, as at H = 4096 or 7168
tile = dict(getattr(K, TILE))
options = dict(num_warps=tile.pop("num_warps"), num_stages=tile.pop("num_stages"),
               launch_pdl=True)
src = ASTSource(fn=K._mhc_project_kernel, signature=sig,
                constexprs=dict(tile, MMA_BF16=True, PDL=True),
                attrs={(i,): aligned for i in (0, 1, 2, 3, 5, 6)})
compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
ir = compiled.asm["ttgir"]
body = ir[ir.index("scf.for"):ir.index("scf.yield")]
ops = re.findall(r"ttng\.warp_group_dot_wait[^\n]*?pendings = (\d+)|"
                 r"(ttng\.warp_group_dot |ttg\.async_copy_global_to_local)", body)
buffers = re.findall(r"ttg\.local_alloc[^\n]*?-> !ttg\.memdesc<(\d+)x(\d+)x(\d+)xbf16", ir)
print(json.dumps({"ops": [("wait" + p) if p else ("mma" if "dot" in o else "copy") for p, o in ops],
                  "shared": compiled.metadata.shared, "buffers": sorted(buffers)}))
"""
    got = compiled_offline(code)
    want = {"PROJECT_TILE": (80, [["2", "64", "128"], ["3", "128", "64"]]),
            "PROJECT_TILE_WIDE": (160, [["3", "128", "128"], ["4", "128", "64"]])}[tile]
    assert (got["shared"], got["buffers"]) == (want[0] * 2**10, want[1]), got
    ops = got["ops"]
    mma, first_copy = ops.index("mma"), ops.index("copy")
    assert ops.count("mma") == 1 and mma < first_copy, ops
    assert "wait0" in ops[mma:first_copy], ops


@pytest.mark.parametrize("tile", ["PROJECT_TILE", "PROJECT_TILE_WIDE"])
def test_dependent_launches_wait_before_their_first_read(tile):
    """On a GPU, mhc_pre's projection and big-fuse are programmatic dependent launches: each may
    start while the kernel ahead of it (the split, the projection) is still running, so it must
    not read memory before ``gdc_wait``. Compiled for sm_90 without a GPU, as mhc_pre launches
    them: in each kernel's PTX the one ``griddepcontrol.wait`` comes before the first global
    load (plain or ``cp.async``), and the kernels ahead of them let them launch
    (``griddepcontrol.launch_dependents``; the projection's after its K loop)."""
    code = f"TILE = {tile!r}\n" + r"""
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelnotes.mhc import kernel as K

def ptx(fn, types, consts, aligned=(), **options):  # aligned: names 16-byte aligned or 16 | n
    sig = {name: types.get(name, "constexpr") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]

f32, bf16 = "*fp32", "*bf16"
tile = dict(getattr(K, TILE))
warps, stages = tile.pop("num_warps"), tile.pop("num_stages")
project = ptx(K._mhc_project_kernel,
              dict(x_ptr=bf16, w_ptr=bf16, dot_ptr=f32, sq_ptr=f32, T="i32", K="i32",
                   K_SPLIT="i32"), dict(tile, MMA_BF16=True, PDL=True),
              ("x_ptr", "w_ptr", "dot_ptr", "sq_ptr", "K", "K_SPLIT"),  # as at H = 4096, 7168
              num_warps=warps, num_stages=stages, launch_pdl=True)
fuse = ptx(K._mhc_pre_fuse_kernel,
           dict(dot_ptr=f32, sq_ptr=f32, res_ptr=bf16, scale_ptr=f32, base_ptr=f32, li_ptr=bf16,
                post_ptr=f32, comb_ptr=f32, T="i32", H="i32", S="i32", inv_k="fp32",
                rms_eps="fp32", pre_eps="fp32", sinkhorn_eps="fp32", post_mult="fp32",
                sinkhorn_iters="i32"),
           dict(S_MAX=2, REVERSE=True, META_T=128, BLOCK_T=1, BLOCK_H=1024, PDL=True),
           ("dot_ptr", "sq_ptr", "res_ptr", "li_ptr", "post_ptr", "comb_ptr", "H"),
           num_warps=4, launch_pdl=True)
split = ptx(K._mhc_split_fn_kernel, dict(fn_ptr=f32, w_ptr=bf16, n="i32"),
            dict(BLOCK=K.SPLIT_TILE["BLOCK"], PDL=True), ("fn_ptr", "w_ptr", "n"),
            num_warps=K.SPLIT_TILE["num_warps"])

def order(text):
    pattern = (r"griddepcontrol\.wait|griddepcontrol\.launch_dependents|ld\.global"
               r"|cp\.async\.c[ag]")
    marks = {m.start(): m.group(0) for m in re.finditer(pattern, text)}
    return [marks[i] for i in sorted(marks)]

print(json.dumps({"project": order(project), "fuse": order(fuse), "split": order(split)}))
"""
    ops = compiled_offline(code)
    for name in ("project", "fuse"):
        seq = ops[name]
        assert seq.count("griddepcontrol.wait") == 1, (name, seq)
        assert seq[0] == "griddepcontrol.wait", (name, seq)
        assert any(op.startswith(("ld.global", "cp.async")) for op in seq), (name, seq)
    assert "griddepcontrol.launch_dependents" in ops["split"], ops["split"]
    reads = [i for i, op in enumerate(ops["project"]) if op.startswith(("ld.global", "cp.async"))]
    assert ops["project"].index("griddepcontrol.launch_dependents") > max(reads), ops["project"]


# ---- refusals ----------------------------------------------------------------------------------

def test_refusals_pre():
    residual, fn, scale, base = make_inputs(2, 64)
    with pytest.raises(TypeError, match="residual must have dtype"):
        mhc_pre(residual.float(), fn, scale, base, config=PRE_CFG)
    with pytest.raises(ValueError, match=r"residual must be \[T, 4, H\]"):
        mhc_pre(residual[:, :3].contiguous(), fn, scale, base, config=PRE_CFG)
    with pytest.raises(ValueError, match="residual must not be empty"):
        mhc_pre(residual[:0], fn, scale, base, config=PRE_CFG)
    with pytest.raises(ValueError, match="residual must be contiguous"):
        mhc_pre(residual.transpose(0, 1), fn, scale, base, config=PRE_CFG)
    with pytest.raises(ValueError, match=r"fn must have shape \(24, 4H\)"):
        mhc_pre(residual, fn[:, :-1].contiguous(), scale, base, config=PRE_CFG)
    with pytest.raises(TypeError, match="fn must have dtype"):
        mhc_pre(residual, fn.double(), scale, base, config=PRE_CFG)
    with pytest.raises(ValueError, match=r"a split fn \(bfloat16\) must have shape \(2, 24, 4H\)"):
        mhc_pre(residual, fn.bfloat16(), scale, base, config=PRE_CFG)
    with pytest.raises(ValueError, match=r"a split fn .* got \(2, 24, 252\)"):
        mhc_pre(residual, split_fn(fn)[..., :-4].contiguous(), scale, base, config=PRE_CFG)
    with pytest.raises(TypeError, match="fn must have dtype"):
        split_fn(fn.double())
    with pytest.raises(ValueError, match=r"fn must have shape \(24, 4H\) with H >= 1"):
        split_fn(fn[:23])
    with pytest.raises(ValueError, match=r"fn must have shape \(24, 4H\) with H >= 1"):
        split_fn(fn[:, :-1].contiguous())
    with pytest.raises(ValueError, match="fn must have 2 dimensions"):
        split_fn(fn[None])
    with pytest.raises(ValueError, match="fn is on meta"):
        split_fn(fn.to("meta"))
    with pytest.raises(ValueError, match=r"scale must have shape \(3,\)"):
        mhc_pre(residual, fn, base, base, config=PRE_CFG)
    with pytest.raises(ValueError, match=r"base must have shape \(24,\)"):
        mhc_pre(residual, fn, scale, scale, config=PRE_CFG)
    with pytest.raises(ValueError, match="scale is on meta"):
        mhc_pre(residual, fn, scale.to("meta"), base, config=PRE_CFG)
    with pytest.raises(ValueError, match="sinkhorn_eps must be a finite number > 0"):
        mhc_pre(residual, fn, scale, base, sinkhorn_eps=0.0, config=PRE_CFG)
    with pytest.raises(ValueError, match="rms_eps must be a finite number > 0"):
        mhc_pre(residual, fn, scale, base, rms_eps=-1e-6, config=PRE_CFG)
    with pytest.raises(TypeError, match="pre_eps must be a real number, got str"):
        mhc_pre(residual, fn, scale, base, pre_eps="1e-6", config=PRE_CFG)
    with pytest.raises(ValueError, match="post_mult must be a finite number, got inf"):
        mhc_pre(residual, fn, scale, base, post_mult=float("inf"), config=PRE_CFG)
    with pytest.raises(ValueError, match="sinkhorn_iters must be an int >= 1"):
        mhc_pre(residual, fn, scale, base, sinkhorn_iters=0, config=PRE_CFG)
    with pytest.raises(ValueError, match="num_splits must be an int >= 1"):
        mhc_pre(residual, fn, scale, base, num_splits=0, config=PRE_CFG)
    with pytest.raises(ValueError, match="residual is on"):
        mhc_pre(residual.to("meta"), fn, scale, base, config=PRE_CFG)


def test_refusals_of_configs():
    residual, fn, scale, base = make_inputs(2, 64)
    x, post, comb = residual[:, 0].contiguous(), torch.rand(2, 4, device=DEVICE), \
        torch.rand(2, 4, 4, device=DEVICE)
    dot, sq = torch.zeros(2, 24, device=DEVICE), torch.ones(2, device=DEVICE)
    with pytest.raises(ValueError, match="keys 'project' and 'fuse'"):
        mhc_pre(residual, fn, scale, base, config={"fuse": STREAM_CFG})
    bad_k = {"project": {**PRE_CFG["project"], "BLOCK_K": 48}, "fuse": STREAM_CFG}
    with pytest.raises(ValueError, match=r"config\['project'\] BLOCK_K=48 must be a power of two "
                                         r">= 16 dividing 256$"):
        mhc_pre(residual, fn, scale, base, config=bad_k)
    small_t = {"project": {**PRE_CFG["project"], "BLOCK_T": 8}, "fuse": STREAM_CFG}
    with pytest.raises(ValueError, match=r"config\['project'\] BLOCK_T=8 must be a power of two "
                                         r">= 16$"):
        mhc_pre(residual, fn, scale, base, config=small_t)
    with pytest.raises(ValueError, match=r"config must set exactly BLOCK_T, BLOCK_H \(and may set "
                                         r"num_warps, num_stages\): missing BLOCK_H$"):
        mhc_post(x, residual, post, comb, config={"BLOCK_T": 2})
    with pytest.raises(ValueError, match=r"\): unknown BLOCK_K$"):
        mhc_post(x, residual, post, comb, config={**STREAM_CFG, "BLOCK_K": 64})
    with pytest.raises(ValueError, match=r"config BLOCK_H=100 must be a power of two >= 1$"):
        mhc_pre_from_mixes(dot, sq, residual, scale, base, config={**STREAM_CFG, "BLOCK_H": 100})
    with pytest.raises(TypeError, match="config must be a dict"):
        mhc_pre_from_mixes(dot, sq, residual, scale, base, config=[2, 1024])


def test_refusals_from_mixes_and_post():
    residual, fn, scale, base = make_inputs(2, 64)
    dot, sq = torch.zeros(2, 24, device=DEVICE), torch.ones(2, device=DEVICE)
    with pytest.raises(ValueError, match=r"dot_mix must be \[T, 24\] or \[S, T, 24\]"):
        mhc_pre_from_mixes(dot[:1], sq, residual, scale, base, config=STREAM_CFG)
    with pytest.raises(ValueError, match=r"sqrsum must be \[T\] or \[S, T\]"):
        mhc_pre_from_mixes(dot, sq[:1], residual, scale, base, config=STREAM_CFG)
    with pytest.raises(TypeError, match="dot_mix must have dtype"):
        mhc_pre_from_mixes(dot.double(), sq, residual, scale, base, config=STREAM_CFG)
    x = residual[:, 0].contiguous()
    post, comb = torch.ones(2, 4, device=DEVICE), torch.ones(2, 4, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"x must have shape \(T, H\)"):
        mhc_post(x[:, :-1].contiguous(), residual, post, comb, config=STREAM_CFG)
    with pytest.raises(ValueError, match=r"post_mix must have shape"):
        mhc_post(x, residual, post[:, :3].contiguous(), comb, config=STREAM_CFG)
    with pytest.raises(ValueError, match=r"comb_mix must have shape"):
        mhc_post(x, residual, post, comb[:, :3].contiguous(), config=STREAM_CFG)
    with pytest.raises(TypeError, match="x must have dtype"):
        mhc_post(x.float(), residual, post, comb, config=STREAM_CFG)


# ---- the math (NumPy reference, float64) ----------------------------------------------------

def test_reference_sinkhorn_marginals_converge():
    logits = np.random.default_rng(0).normal(size=(256, 4, 4))
    errs = []
    for iters in (1, 5, 20, 40):
        c = R.sinkhorn(logits, iters, eps=0.0)  # eps = 0: the pure projection
        errs.append(np.abs(c.sum(-1) - 1).max())  # rows; columns are exact after each step
        assert np.abs(c.sum(-2) - 1).max() < 1e-14
    # linear convergence: each iteration shrinks the row error by a constant factor
    assert errs[0] > errs[1] > errs[2] > errs[3] and errs[3] < errs[2] ** 1.5


def test_reference_birkhoff_properties():
    rng = np.random.default_rng(1)
    B1, B2 = (R.sinkhorn(rng.normal(size=(4, 4)) * 2, 200, eps=0.0).T for _ in range(2))
    for M in (B1, B2, B1 @ B2):  # closed under products
        assert np.allclose(M.sum(0), 1, atol=1e-12) and np.allclose(M.sum(1), 1, atol=1e-12)
        assert (M >= 0).all()
        assert np.linalg.norm(M, 2) <= 1 + 1e-12  # spectral norm 1 (the all-ones vector)


def test_reference_mhc_layer_composes_pre_and_post():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(3, 4, 16))
    fn, scale, base = rng.normal(size=(24, 64)) / 8, np.ones(3), rng.normal(size=24)
    F = np.tanh
    li, post, comb = R.mhc_pre(X, fn, scale, base)
    B = comb.transpose(0, 2, 1)
    want = post[..., None] * F(li)[:, None, :] + np.einsum("tkj,tjh->tkh", B, X)
    assert np.allclose(R.mhc_layer(X, F, fn, scale, base), want)  # B = comb^T


def test_reference_split_k_sums_to_the_projection():
    X = np.random.default_rng(3).normal(size=(5, 4, 10))
    fn = np.random.default_rng(4).normal(size=(24, 40))
    dot, sq = R.project_split_k(X, fn, 3)
    x = X.reshape(5, 40)
    assert np.allclose(dot.sum(0), x @ fn.T) and np.allclose(sq.sum(0), (x * x).sum(-1))
    a = R.mhc_pre_from_mixes(dot, sq, X, np.ones(3), np.zeros(24))
    b = R.mhc_pre(X, fn, np.ones(3), np.zeros(24))
    assert all(np.allclose(u, v) for u, v in zip(a, b, strict=True))


def test_torch_reference_agrees_with_numpy():
    """The benchmark's eager peer computes the same function (float32)."""
    residual, fn, scale, base = (t.cpu() for t in make_inputs(6, 64))
    got = mhc_pre_torch(residual, fn, scale, base)
    ref = R.mhc_pre(f64(residual), f64(fn), f64(scale), f64(base))
    check_pre(got, ref, TOL_GATES_PROJECTED)
    x = got[0]
    out = mhc_post_torch(x, residual, got[1], got[2])
    assert rel_err(out, R.mhc_post(f64(x), f64(residual), f64(got[1]), f64(got[2]))) < TOL_BF16


@pytest.mark.gpu
def test_streaming_kernels_run_near_the_memory_roofline():
    """A loose floor (half the copy rate) that catches a kernel gone wrong, not the issue's bar
    (that is the benchmark's job: `python -m benchmarks mhc`)."""
    import triton

    from kernelnotes.mhc.reference import bytes_per_token

    def copy_gbs():
        src = torch.empty(1 << 28, device=DEVICE)
        dst = torch.empty_like(src)
        return 2 * src.nbytes / (triton.testing.do_bench(lambda: dst.copy_(src)) * 1e-3) / 1e9

    copy = copy_gbs()
    T, H = 8192, 7168
    residual, fn, scale, base = make_inputs(T, H)
    x = residual[:, 2].contiguous()
    post, comb = torch.rand(T, 4, device=DEVICE), torch.rand(T, 4, 4, device=DEVICE)
    flat = residual.flatten(1).float()
    dot, sq = (flat @ fn.T).contiguous(), flat.square().sum(-1)
    del flat
    for op, call in (("mhc_post", lambda: mhc_post(x, residual, post, comb, config=STREAM_CFG)),
                     ("mhc_pre_from_mixes", lambda: mhc_pre_from_mixes(
                         dot, sq, residual, scale, base, config=STREAM_CFG))):
        ms = triton.testing.do_bench(call)
        gbs = T * bytes_per_token(op, H) / (ms * 1e-3) / 1e9
        assert gbs > 0.5 * copy, (op, gbs, copy)



# ------------------------------------------------------- one-pass design study (Gluon, Hopper)
def onepass():
    from kernelnotes.mhc import onepass as op

    return op


def test_onepass_refuses_cpu_tensors():
    """Gluon kernels do not run in the interpreter: on any machine a CPU tensor is refused with a
    message that says so."""
    residual, fn, scale, base = (t.cpu() for t in make_inputs(3, 64))
    with pytest.raises(ValueError, match="residual is on cpu: mhc_pre_onepass needs a CUDA"):
        onepass().mhc_pre_onepass(residual, fn, scale, base)


def test_onepass_compiles_for_sm90_without_a_gpu():
    """The one-pass kernel, compiled for sm_90 without the interpreter at H = 7168 (56 slices of
    128 columns): its tile of 64 tokens x 4 streams x 128 columns (64 KiB) and the barrier fit
    three programs in an SM's 228 KiB, and the slices report with a release and wait with an
    acquire at GPU scope."""
    code = r"""
import json, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from kernelnotes.mhc import onepass as op
lay = gl.NVMMASharedLayout.get_default_for([op.BT, op.CHUNK], gl.bfloat16)
cx = dict(G=56, G_POW2=64, BH=128)
sig = dict(x_desc=f"tensordesc<bf16[{op.BT}, {op.CHUNK}],{lay!r}>", w_ptr="*bf16",
           part_ptr="*fp32", gate_ptr="*fp32", count_ptr="*i32", base_ptr="*fp32",
           scale_ptr="*fp32", mix_ptr="*fp32", sq_ptr="*fp32", li_ptr="*bf16", T="i32", H="i32",
           n_items="i32", n_blocks="i32", num_programs="i32", inv_k="fp32", rms_eps="fp32",
           pre_eps="fp32", **{k: "constexpr" for k in cx})
ck = triton.compile(GluonASTSource(fn=op._mhc_pre_onepass_kernel, signature=sig, constexprs=cx),
                    target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
ptx = ck.asm["ptx"]
print(json.dumps(dict(shared=ck.metadata.shared, release="atom.global.gpu.acq_rel.add" in ptx,
                      flag="atom.global.gpu.release.exch" in ptx,
                      acquire="ld.global.gpu.acquire" in ptx)))
"""
    got = compiled_offline(code)
    tile = 64 * 4 * 128 * 2
    assert tile <= got["shared"] and onepass().PROGRAMS_PER_SM * got["shared"] <= 228 * 1024
    assert got["release"] and got["flag"] and got["acquire"]


@pytest.mark.gpu
@pytest.mark.parametrize("T,H", [(1, 64), (37, 192), (1000, 4096), (8192, 7168)])
def test_onepass_matches_reference_and_repeats(T, H, monkeypatch):
    """Against the float64 reference with NaN-poisoned outputs and scratch; T = 37 and 1000 leave
    a partial token block, H = 192 takes slices of 64 columns. Two calls give the same bits: the
    partials are summed in slice order, whichever slice arrives last."""
    residual, fn, scale, base = make_inputs(T, H, seed=T + H)
    poison_allocations(monkeypatch)
    got = onepass().mhc_pre_onepass(residual, fn, scale, base)
    again = onepass().mhc_pre_onepass(residual, fn, scale, base)
    monkeypatch.undo()
    check_pre(got, R.mhc_pre(f64(residual), f64(fn), f64(scale), f64(base)), TOL_GATES_PROJECTED)
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_onepass_refuses_what_tma_cannot_take():
    residual, fn, scale, base = make_inputs(3, 100)
    with pytest.raises(ValueError, match="H = 100: mhc_pre_onepass needs H a multiple of 64"):
        onepass().mhc_pre_onepass(residual, fn, scale, base)
    residual, fn, scale, base = make_inputs(3, 64)
    with pytest.raises(ValueError, match="fn must have shape"):
        onepass().mhc_pre_onepass(residual, fn[:, :128].contiguous(), scale, base)


# ------------------------------------- pipelined one-pass design study (Gluon, warp-specialized)
def pipelined():
    from kernelnotes.mhc import pipelined as pp

    return pp


def test_pipelined_refuses_cpu_tensors():
    residual, fn, scale, base = (t.cpu() for t in make_inputs(3, 64))
    with pytest.raises(ValueError, match="residual is on cpu: mhc_pre_pipelined needs a CUDA"):
        pipelined().mhc_pre_pipelined(residual, fn, scale, base)


def test_pipelined_grid_takes_one_program_per_sm_and_a_lane_per_slice_set():
    """G = H / 64 slices a lane, as many lanes as an H200's 132 SMs hold, and the longest lane's
    steps."""
    grid = pipelined().grid
    assert grid(8192, 7168, 132) == (112, 1, 128)
    assert grid(8192, 4096, 132) == (128, 2, 64)
    assert grid(1000, 192, 132) == (48, 16, 1)
    assert grid(37, 64, 132) == (1, 1, 1)
    assert grid(1, 8448, 132) == (132, 1, 1)


@pytest.mark.parametrize("stamp", [False, True])
def test_pipelined_compiles_for_sm90_without_a_gpu(stamp):
    """Compiled for sm_90 without the interpreter at H = 7168 (112 slices in 14 groups): four
    tile buffers and fn's slice fit one program in an SM's 228 KiB; each partition synchronises
    its own 128 threads (named barriers, never the whole CTA); slices count in with acq_rel
    atomics, the reducer waits with an acquire load; the projection is wgmma; the timer is read
    only when stamps are asked for."""
    code = r"""
import json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from kernelnotes.mhc import pipelined as pp
lay = gl.NVMMASharedLayout.get_default_for([pp.BT, pp.BH], gl.bfloat16)
w_lay = gl.NVMMASharedLayout.get_default_for([32, pp.BH], gl.bfloat16)
cx = dict(G=112, NG=14, NG_POW2=16, GROUP=pp.GROUP, NBUF=pp.NBUF, STAMP=STAMP)
sig = dict(x_desc=f"tensordesc<bf16[{pp.BT}, {pp.BH}],{lay!r}>",
           w_desc=f"tensordesc<bf16[32, {pp.BH}],{w_lay!r}>", part_ptr="*fp32",
           group_ptr="*fp32", gate_ptr="*fp32", count_ptr="*i32", base_ptr="*fp32",
           scale_ptr="*fp32", mix_ptr="*fp32", sq_ptr="*fp32", li_ptr="*bf16", stamp_ptr="*i64",
           T="i32", H="i32", n_blocks="i32", R="i32", n_steps_max="i32", inv_k="fp32",
           rms_eps="fp32", pre_eps="fp32", **{k: "constexpr" for k in cx})
ck = triton.compile(GluonASTSource(fn=pp._mhc_pre_pipelined_kernel, signature=sig, constexprs=cx),
                    target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
ptx = ck.asm["ptx"]
bars = {line.split(";")[0].split()[-1] for line in ptx.splitlines() if "bar.sync" in line}
print(json.dumps(dict(shared=ck.metadata.shared, bars=sorted(bars),
                      arrive="atom.global.gpu.acq_rel.add" in ptx,
                      acquire="ld.global.gpu.acquire" in ptx, wgmma="wgmma.mma_async" in ptx,
                      timer="%globaltimer" in ptx)))
""".replace("STAMP=STAMP", f"STAMP={stamp}")
    got = compiled_offline(code)
    pp = pipelined()
    tiles = pp.NBUF * 4 * pp.BT * pp.BH * 2 + 8 * 32 * pp.BH * 2
    assert tiles <= got["shared"] <= 228 * 1024
    assert got["bars"] == ["128"], got["bars"]  # "bar.sync id, 128": one warpgroup at a time
    assert got["arrive"] and got["acquire"] and got["wgmma"]
    assert got["timer"] == stamp


@pytest.mark.gpu
@pytest.mark.parametrize("T,H", [(1, 64), (37, 192), (1000, 4096), (8192, 7168)])
def test_pipelined_matches_reference_and_repeats(T, H, monkeypatch):
    """Against the float64 reference with NaN-poisoned outputs and scratch; T = 37 and 1000 leave
    a partial token block, H = 192 makes one group of three slices, H = 4096 two lanes. A second
    call, with the timer's stamps, gives the same bits, and each step's stamps come in the order
    the pipeline imposes."""
    residual, fn, scale, base = make_inputs(T, H, seed=T + H)
    poison_allocations(monkeypatch)
    got = pipelined().mhc_pre_pipelined(residual, fn, scale, base)
    *again, stamps = pipelined().mhc_pre_pipelined(residual, fn, scale, base, stamps=True)
    monkeypatch.undo()
    check_pre(got, R.mhc_pre(f64(residual), f64(fn), f64(scale), f64(base)), TOL_GATES_PROJECTED)
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)
    programs, lanes, steps = pipelined().grid(T, H, torch.cuda.get_device_properties(0)
                                              .multi_processor_count)
    assert stamps.shape == (programs, steps, 8)
    issued, ready, written, arrived, published, seen, freed = stamps[..., :7].unbind(-1)
    done = issued > 0  # a lane's steps past its last block stay zero
    n_blocks = -(-T // 64)
    assert int(done.sum()) == n_blocks * (programs // lanes)
    for a, b in ((issued, ready), (ready, written), (written, arrived), (seen, freed)):
        assert bool((a[done] <= b[done]).all())
    assert int((published > 0).sum()) == n_blocks  # one publisher a block


@pytest.mark.gpu
def test_pipelined_refuses_what_it_cannot_take():
    residual, fn, scale, base = make_inputs(3, 100)
    with pytest.raises(ValueError, match="H = 100: mhc_pre_pipelined needs H a multiple of 64"):
        pipelined().mhc_pre_pipelined(residual, fn, scale, base)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    residual, fn, scale, base = make_inputs(1, 64 * (sms + 1))
    with pytest.raises(ValueError, match="slices of 64 columns need as many programs at once"):
        pipelined().mhc_pre_pipelined(residual, fn, scale, base)
    residual, fn, scale, base = make_inputs(3, 64)
    with pytest.raises(ValueError, match="fn must have shape"):
        pipelined().mhc_pre_pipelined(residual, fn[:, :128].contiguous(), scale, base)
