"""mHC: Triton mhc_pre / mhc_pre_from_mixes / mhc_post against the float64 NumPy reference.

Inputs are consistent (dot_mix and sqrsum are computed from the residual they go with, not
random), logits are O(1) so that Sinkhorn has work to do, and H does not divide BLOCK_H.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kernelnotes._testing import UNIT_ROUNDOFF, poison_allocations, rel_err
from kernelnotes.mhc import kernel as K
from kernelnotes.mhc import reference as R
from kernelnotes.mhc.kernel import _round_bf16, mhc_post, mhc_pre, mhc_pre_from_mixes, split_fn
from kernelnotes.mhc.torch_reference import (
    mhc_post_torch,
    mhc_post_vjp_torch,
    mhc_pre_torch,
    mhc_pre_vjp_torch,
)
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
    runs the autotuner; later T of the bucket launch the jit kernel with the chosen config
    (Triton's public launch, kernel[grid](...)), on a grid of their own."""
    calls = []

    class Kernel:  # the jit function: kernel[grid](*args, **constexprs)
        def __getitem__(self, grid):
            return lambda *args, **consts: calls.append(("launch", grid, consts))

    class Tuned:  # the autotuner around it
        best_config = triton.Config({"BLOCK_T": 4}, num_warps=2)

        def __getitem__(self, grid):
            return lambda *args, **consts: calls.append(("tune", None, consts))

    monkeypatch.setattr(K, "_CHOSEN", {})
    tuned, x = Tuned(), torch.zeros(1)
    for T in (600, 1000, 1024, 1025):
        key = ("post", 64, K._tokens_key(T), x.device)
        K._run_tuned(tuned, Kernel(), lambda m, T=T: (triton.cdiv(T, m["BLOCK_T"]),), key, x, T,
                     S_MAX=2)
    assert [c[0] for c in calls] == ["tune", "launch", "launch", "tune"]
    assert calls[0][2] == {"S_MAX": 2}
    assert calls[1][1:] == ((250,), {"S_MAX": 2, **Tuned.best_config.all_kwargs()})
    assert calls[2][1] == (256,)


def test_kernel_module_uses_no_triton_internals():
    """The launchers go through Triton's public launch (kernel[grid](...)), not the compiled
    kernel's private runner (CompiledKernel.run, packed_metadata) or the driver."""
    import inspect

    src = inspect.getsource(K)
    for private in ("packed_metadata", "compiled.run", "triton.runtime", "knobs", "driver"):
        assert private not in src, private


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
        config = dict(getattr(K, name))
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


def test_backward_passes_compile_for_sm90_as_designed():
    """The backward's passes, compiled for sm_90 without a GPU at their GPU tiles: the pre
    pass's loop is not software-pipelined (no asynchronous copy to refill the residual tile that
    one of its MMAs reads, the pipeliner's hazard of _mhc_project_kernel) and waits for its MMAs
    in the loop; the post pass's 20 row sums a step stay inside a warp (no barrier at all); the
    gates' backward compiles at its GPU block."""
    code = r"""
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelnotes.mhc import kernel as K

def compile_(fn, types, tile, aligned):
    tile = dict(tile)
    options = {k: tile.pop(k) for k in ("num_warps", "num_stages") if k in tile}
    sig = {name: types.get(name, "constexpr") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=tile, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

f32, bf16 = "*fp32", "*bf16"
pre = compile_(K._mhc_pre_bwd_kernel,
               dict(res_ptr=bf16, w_ptr=bf16, g_li_ptr=bf16, g_dot_ptr=f32, g_sq_ptr=f32,
                    pre_ptr=f32, g_res_ptr=bf16, g_w_ptr=f32, T="i32", H="i32", T_SPLIT="i32"),
               dict(K.PRE_BWD_TILE, MMA_BF16=True),
               ("res_ptr", "w_ptr", "g_li_ptr", "g_dot_ptr", "g_res_ptr", "g_w_ptr", "H"))
ir = pre.asm["ttgir"]
body = ir[ir.index("scf.for"):ir.index("scf.yield")]
streams = {}
for name, fn, types in (
        ("post", K._mhc_post_bwd_kernel,
         dict(g_ptr=bf16, f_ptr=bf16, res_ptr=bf16, post_ptr=f32, comb_ptr=f32, g_f_ptr=bf16,
              g_res_ptr=bf16, g_mix_ptr=f32, T="i32", H="i32")),
        ("rows", K._mhc_pre_bwd_rows_kernel,
         dict(res_ptr=bf16, g_li_ptr=bf16, g_pre_ptr=f32, T="i32", H="i32"))):
    aligned = [a for a, t in types.items() if t.startswith("*")] + ["H"]  # as at H = 7168
    ptx = compile_(fn, types, K.STREAM_BWD_TILE, aligned).asm["ptx"]
    streams[name] = len(re.findall(r"bar\.sync", ptx))
gates = compile_(K._mhc_gates_bwd_kernel,
                 {name: ("*fp32" if name.endswith("_ptr") else "fp32")
                  for name in K._mhc_gates_bwd_kernel.arg_names if name != "BLOCK_T"}
                 | dict(T="i32", sinkhorn_iters="i32"),
                 dict(BLOCK_T=K.GATES_BWD_BLOCK_T["cuda"], num_warps=K.GATES_BWD_WARPS), ())
print(json.dumps({"gates_warps": gates.metadata.num_warps,
                  "async_copies": body.count("async_copy"),
                  "mma": len(re.findall(r"ttng\.warp_group_dot |tt\.dot ", body)),
                  "waits": re.findall(r"warp_group_dot_wait[^\n]*?pendings = (\d+)", body),
                  "barriers": streams}))
"""
    got = compiled_offline(code)
    assert got["async_copies"] == 0, got
    assert got["mma"] == 5 and got["waits"] and set(got["waits"]) == {"0"}, got
    assert got["barriers"]["post"] == 0, got
    assert got["gates_warps"] == K.GATES_BWD_WARPS, got


# ---- refusals: one table of bad inputs per public function ----------------------------------
# Each row: (kind, a function of the good keyword arguments giving the bad ones, the expected
# outcome). The outcome is (TypeError or ValueError, a regex naming the argument), or "reference":
# the call succeeds and gives what the float32 torch reference gives (NaN where it has NaN).

def _good(T=2, H=64):
    residual, fn, scale, base = make_inputs(T, H)
    flat = residual.flatten(1).float()
    return dict(residual=residual, fn=fn, scale=scale, base=base,
                dot_mix=(flat @ fn.T).contiguous(), sqrsum=flat.square().sum(-1).contiguous(),
                x=residual[:, 1].contiguous(), post_mix=2 * torch.rand(T, 4, device=DEVICE),
                comb_mix=torch.rand(T, 4, 4, device=DEVICE))


def _with(**changes):
    return lambda a: {**a, **{k: (v(a) if callable(v) else v) for k, v in changes.items()}}


def _set(name, index, value):
    def change(a):
        t = a[name].clone()
        t[index] = value
        return t
    return change


NAN, INF = float("nan"), float("inf")
PRE_BAD = [
    ("wrong dtype", _with(residual=lambda a: a["residual"].float()), (TypeError, "residual")),
    ("mixed dtypes", _with(fn=lambda a: a["fn"].double()), (TypeError, "fn")),
    ("mixed dtypes (scale)", _with(scale=lambda a: a["scale"].half()), (TypeError, "scale")),
    ("not a tensor", _with(residual=lambda a: a["residual"].tolist()), (TypeError, "residual")),
    ("wrong rank", _with(residual=lambda a: a["residual"][0]), (ValueError, "residual")),
    ("wrong stream count", _with(residual=lambda a: a["residual"][:, :3].contiguous()),
     (ValueError, "residual")),
    ("mismatched shapes", _with(fn=lambda a: a["fn"][:, :-4].contiguous()), (ValueError, "fn")),
    ("mismatched shapes (base)", _with(base=lambda a: a["base"][:3]), (ValueError, "base")),
    ("empty", _with(residual=lambda a: a["residual"][:0]), (ValueError, "residual")),
    ("non-contiguous", _with(residual=lambda a: a["residual"].transpose(0, 1)),
     (ValueError, "residual")),
    ("wrong device", _with(scale=lambda a: a["scale"].to("meta")), (ValueError, "scale")),
    ("wrong device (residual)", _with(residual=lambda a: a["residual"].to("meta")),
     (ValueError, "residual")),
    ("non-finite eps", _with(rms_eps=NAN), (ValueError, "rms_eps")),
    ("non-positive eps", _with(sinkhorn_eps=0.0), (ValueError, "sinkhorn_eps")),
    ("non-finite post_mult", _with(post_mult=INF), (ValueError, "post_mult")),
    ("string hyperparameter", _with(pre_eps="1e-6"), (TypeError, "pre_eps")),
    ("bool sinkhorn_iters", _with(sinkhorn_iters=True), (TypeError, "sinkhorn_iters")),
    ("zero sinkhorn_iters", _with(sinkhorn_iters=0), (ValueError, "sinkhorn_iters")),
    ("float num_splits", _with(num_splits=2.0), (TypeError, "num_splits")),
    ("invalid config", _with(config={"fuse": {"BLOCK_T": 4, "BLOCK_H": 64}}),
     (ValueError, "config")),
    ("NaN in residual", _with(residual=_set("residual", (1, 2, 3), NAN)), "reference"),
    ("inf in residual", _with(residual=_set("residual", (0, 0, 5), INF)), "reference"),
    ("inf in fn (a pre row)", _with(fn=_set("fn", (1, 7), INF)), "reference"),
    ("-inf in fn (a post row)", _with(fn=_set("fn", (5, 9), -INF)), "reference"),
    ("inf in fn (a comb row)", _with(fn=_set("fn", (9, 3), INF)), "reference"),
]
FROM_MIXES_BAD = [
    ("wrong dtype", _with(dot_mix=lambda a: a["dot_mix"].double()), (TypeError, "dot_mix")),
    ("mixed dtypes", _with(sqrsum=lambda a: a["sqrsum"].half()), (TypeError, "sqrsum")),
    ("wrong residual dtype", _with(residual=lambda a: a["residual"].float()),
     (TypeError, "residual")),
    ("wrong rank", _with(dot_mix=lambda a: a["dot_mix"][None, None]), (ValueError, "dot_mix")),
    ("mismatched shapes", _with(dot_mix=lambda a: a["dot_mix"][:1]), (ValueError, "dot_mix")),
    ("mismatched splits", _with(sqrsum=lambda a: a["sqrsum"][None].expand(2, -1).contiguous()),
     (ValueError, "sqrsum")),
    ("empty", _with(residual=lambda a: a["residual"][:0], dot_mix=lambda a: a["dot_mix"][:0],
                    sqrsum=lambda a: a["sqrsum"][:0]), (ValueError, "residual")),
    ("non-contiguous", _with(dot_mix=lambda a: a["dot_mix"].t().contiguous().t()),
     (ValueError, "dot_mix")),
    ("wrong device", _with(sqrsum=lambda a: a["sqrsum"].to("meta")), (ValueError, "sqrsum")),
    ("non-finite eps", _with(pre_eps=INF), (ValueError, "pre_eps")),
    ("bool sinkhorn_iters", _with(sinkhorn_iters=False), (TypeError, "sinkhorn_iters")),
    ("invalid config", _with(config={"BLOCK_T": 4, "BLOCK_H": 100}), (ValueError, "config")),
    ("config not a dict", _with(config=[4, 64]), (TypeError, "config")),
    ("NaN in dot_mix", _with(dot_mix=_set("dot_mix", (0, 3), NAN)), "reference"),
    ("inf in dot_mix", _with(dot_mix=_set("dot_mix", (1, 2), INF)), "reference"),
]
POST_BAD = [
    ("wrong dtype", _with(x=lambda a: a["x"].float()), (TypeError, "x")),
    ("mixed dtypes", _with(comb_mix=lambda a: a["comb_mix"].double()), (TypeError, "comb_mix")),
    ("not a tensor", _with(post_mix=lambda a: a["post_mix"].tolist()), (TypeError, "post_mix")),
    ("wrong rank", _with(x=lambda a: a["x"][None]), (ValueError, "x")),
    ("mismatched shapes", _with(x=lambda a: a["x"][:, :-1].contiguous()), (ValueError, "x")),
    ("mismatched shapes (post_mix)", _with(post_mix=lambda a: a["post_mix"][:, :3].contiguous()),
     (ValueError, "post_mix")),
    ("mismatched shapes (comb_mix)", _with(comb_mix=lambda a: a["comb_mix"][:1]),
     (ValueError, "comb_mix")),
    ("empty", _with(residual=lambda a: a["residual"][:0], x=lambda a: a["x"][:0]),
     (ValueError, "residual")),
    ("non-contiguous", _with(comb_mix=lambda a: a["comb_mix"].transpose(1, 2)),
     (ValueError, "comb_mix")),
    ("wrong device", _with(x=lambda a: a["x"].to("meta")), (ValueError, "x")),
    ("invalid config", _with(config={"BLOCK_T": 2}), (ValueError, "config")),
    ("non-int config entry", _with(config={"BLOCK_T": 2, "BLOCK_H": 64, "num_warps": 2.5}),
     (ValueError, "config")),
    ("NaN in post_mix", _with(post_mix=_set("post_mix", (0, 1), NAN)), "reference"),
    ("inf in x", _with(x=_set("x", (1, 3), INF)), "reference"),
]
SPLIT_FN_BAD = [
    ("wrong dtype", _with(fn=lambda a: a["fn"].double()), (TypeError, "fn")),
    ("bf16 fn", _with(fn=lambda a: a["fn"].bfloat16()), (TypeError, "fn")),
    ("not a tensor", _with(fn=lambda a: a["fn"].tolist()), (TypeError, "fn")),
    ("wrong rank", _with(fn=lambda a: a["fn"][None]), (ValueError, "fn")),
    ("wrong row count", _with(fn=lambda a: a["fn"][:23]), (ValueError, "fn")),
    ("K not a multiple of 4", _with(fn=lambda a: a["fn"][:, :-1].contiguous()), (ValueError, "fn")),
    ("empty", _with(fn=lambda a: a["fn"][:, :0]), (ValueError, "fn")),
    ("non-contiguous", _with(fn=lambda a: a["fn"][:, ::2]), (ValueError, "fn")),
    ("wrong device", _with(fn=lambda a: a["fn"].to("meta")), (ValueError, "fn")),
    ("inf in fn", _with(fn=_set("fn", (2, 5), INF)), "split"),
    ("huge finite fn", _with(fn=_set("fn", (3, 1), 3.4e38)), "split"),
]


def _call(name, a):
    a = dict(a)
    if name == "mhc_pre":
        kw = {k: a.pop(k) for k in list(a) if k not in ("residual", "fn", "scale", "base")}
        kw = {k: v for k, v in kw.items() if k not in ("dot_mix", "sqrsum", "x", "post_mix",
                                                        "comb_mix")}
        kw.setdefault("config", PRE_CFG)
        return mhc_pre(a["residual"], a["fn"], a["scale"], a["base"], **kw)
    if name == "mhc_pre_from_mixes":
        kw = {k: v for k, v in a.items() if k in ("rms_eps", "pre_eps", "sinkhorn_eps",
                                                  "post_mult", "sinkhorn_iters", "config")}
        kw.setdefault("config", STREAM_CFG)
        return mhc_pre_from_mixes(a["dot_mix"], a["sqrsum"], a["residual"], a["scale"],
                                  a["base"], **kw)
    if name == "mhc_post":
        return mhc_post(a["x"], a["residual"], a["post_mix"], a["comb_mix"],
                        config=a.get("config", STREAM_CFG))
    return split_fn(a["fn"])


def _reference(name, a):
    from kernelnotes.mhc.torch_reference import mhc_pre_from_mixes_torch

    if name == "mhc_pre":
        return mhc_pre_torch(a["residual"], a["fn"], a["scale"], a["base"])
    if name == "mhc_pre_from_mixes":
        return mhc_pre_from_mixes_torch(a["dot_mix"][None], a["sqrsum"][None], a["residual"],
                                        a["scale"], a["base"])
    return mhc_post_torch(a["x"], a["residual"], a["post_mix"], a["comb_mix"])


def _same_as_reference(got, ref):
    """NaN exactly where the reference has NaN, infinities where it has them, the rest close."""
    got = (got,) if isinstance(got, torch.Tensor) else tuple(got)
    ref = (ref,) if isinstance(ref, torch.Tensor) else tuple(ref)
    for g, r in zip(got, ref, strict=True):
        g, r = g.float().cpu(), r.float().cpu()
        assert torch.equal(g.isnan(), r.isnan()), "NaN where the reference has none, or not"
        assert torch.equal(g.isinf(), r.isinf()) and torch.equal(g[g.isinf()], r[r.isinf()])
        fin = g.isfinite()
        assert torch.allclose(g[fin], r[fin], rtol=2e-2, atol=2e-3)


BAD_INPUTS = [pytest.param(name, kind, bad, want, id=f"{name}: {kind}")
              for name, table in (("mhc_pre", PRE_BAD), ("mhc_pre_from_mixes", FROM_MIXES_BAD),
                                  ("mhc_post", POST_BAD), ("split_fn", SPLIT_FN_BAD))
              for kind, bad, want in table]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name,kind,bad,want", BAD_INPUTS)
def test_bad_input(name, kind, bad, want):
    args = bad(_good())
    if want == "reference":
        _same_as_reference(_call(name, args), _reference(name, args))
    elif want == "split":  # hi + lo is fn: an inf carried whole by hi, a huge value finite
        parts = _call(name, args).float()
        assert torch.equal(parts[0] + parts[1], (parts[0].double() + parts[1].double()).float())
        fn = args["fn"]
        assert torch.equal((parts[0] + parts[1]).isinf(), fn.isinf())
        fin = fn.isfinite()
        err = ((parts[0].double() + parts[1].double() - fn.double())[fin].abs()
               / fn.double()[fin].abs().clamp_min(1e-30))
        assert err.max() <= 2.0**-16
    else:
        exc, match = want
        with pytest.raises(exc, match=match):
            _call(name, args)


def test_bad_input_tables_have_eight_kinds_each():
    for table in (PRE_BAD, FROM_MIXES_BAD, POST_BAD, SPLIT_FN_BAD):
        assert len({kind.split(" (")[0] for kind, *_ in table}) >= 8


def test_refusals_of_configs():
    residual, fn, scale, base = make_inputs(2, 64)
    with pytest.raises(ValueError, match=r"config\['project'\] BLOCK_K=48 must be a power of two "
                                         r">= 16 dividing 256$"):
        mhc_pre(residual, fn, scale, base,
                config={"project": {**PRE_CFG["project"], "BLOCK_K": 48}, "fuse": STREAM_CFG})
    with pytest.raises(ValueError, match=r"config\['project'\] BLOCK_T=8 must be a power of two "
                                         r">= 16$"):
        mhc_pre(residual, fn, scale, base,
                config={"project": {**PRE_CFG["project"], "BLOCK_T": 8}, "fuse": STREAM_CFG})
    with pytest.raises(ValueError, match=r"a split fn .* got \(2, 24, 252\)"):
        mhc_pre(residual, split_fn(fn)[..., :-4].contiguous(), scale, base, config=PRE_CFG)
    x = residual[:, 0].contiguous()
    post, comb = torch.rand(2, 4, device=DEVICE), torch.rand(2, 4, 4, device=DEVICE)
    with pytest.raises(ValueError, match=r"config must set exactly BLOCK_T, BLOCK_H \(and may set "
                                         r"num_warps, num_stages\): missing BLOCK_H$"):
        mhc_post(x, residual, post, comb, config={"BLOCK_T": 2})
    with pytest.raises(ValueError, match=r"\): unknown BLOCK_K$"):
        mhc_post(x, residual, post, comb, config={**STREAM_CFG, "BLOCK_K": 64})


# ---- drop-in ops: custom ops, fake tensors, torch.compile, autograd -------------------------

def _small(T=3, H=16):
    residual, fn, scale, base = make_inputs(T, H, seed=7)
    x = residual[:, 2].contiguous()
    post, comb = 2 * torch.rand(T, 4, device=DEVICE), torch.rand(T, 4, 4, device=DEVICE)
    return residual, fn, scale, base, x, post, comb


def test_public_ops_are_kernelnotes_custom_ops():
    for name in ("mhc_pre", "mhc_pre_from_mixes", "mhc_post", "mhc_split_fn"):
        assert hasattr(torch.ops.kernelnotes, name), name


def test_opcheck():
    residual, fn, scale, base, x, post, comb = _small()
    eps = (1e-6, 1e-6, 1e-6, 2.0, 20)
    flat = residual.flatten(1).float()
    dot, sq = (flat @ fn.T)[None].contiguous(), flat.square().sum(-1)[None].contiguous()
    g = torch.Generator().manual_seed(3)
    g_li, g_out = (torch.randn(s, generator=g).bfloat16().to(DEVICE) for s in (x.shape,
                                                                              residual.shape))
    g_dot, g_sq, pre = (torch.randn(s, generator=g).to(DEVICE) for s in ((3, 24), (3,), (3, 4)))
    cases = [(K._mhc_pre_op, (residual, fn, scale, base, *eps, None, None)),
             (K._mhc_pre_from_mixes_op, (dot, sq, residual, scale, base, *eps, None)),
             (K._mhc_post_op, (x, residual, post, comb, None)),
             (K._split_fn_op, (fn,)),
             # the backwards' passes
             (K._pre_mixes_op, (residual, fn)),
             (K._pre_rows_op, (residual, g_li)),
             (K._pre_residual_backward_op, (residual, fn, g_li, g_dot, g_sq, pre, None)),
             (K._gates_backward_op, (g_dot, torch.rand(3, device=DEVICE) + 1, pre, 16, scale,
                                     base, pre, None, *eps)),
             (K._mhc_post_backward_op, (x, residual, post, comb, g_out))]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_fake_tensor_mode_gives_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    T, H = 5, 24
    with FakeTensorMode():
        residual = torch.empty(T, 4, H, dtype=torch.bfloat16, device=DEVICE)
        fn = torch.empty(24, 4 * H, device=DEVICE)
        scale, base = torch.empty(3, device=DEVICE), torch.empty(24, device=DEVICE)
        li, post, comb = mhc_pre(residual, fn, scale, base)
        li2, post2, comb2 = mhc_pre_from_mixes(torch.empty(2, T, 24, device=DEVICE),
                                               torch.empty(2, T, device=DEVICE), residual, scale,
                                               base)
        out = mhc_post(li, residual, post, comb)
        parts = split_fn(fn)
    assert li.shape == li2.shape == (T, H) and li.dtype == torch.bfloat16
    assert post.shape == post2.shape == (T, 4) and post.dtype == torch.float32
    assert comb.shape == comb2.shape == (T, 4, 4) and comb.dtype == torch.float32
    assert out.shape == (T, 4, H) and out.dtype == torch.bfloat16
    assert parts.shape == (2, 24, 4 * H) and parts.dtype == torch.bfloat16


def _layer(residual, fn, scale, base, x):
    """Both ops in one graph; x stands for the sublayer's output (no other op whose compiled
    rounding could differ from eager's)."""
    li, post, comb = mhc_pre(residual, fn, scale, base)
    return li, mhc_post(x, residual, post, comb)


def test_compile_fullgraph_aot_eager_matches_eager():
    args = _small()[:5]
    eager = _layer(*args)
    compiled = torch.compile(_layer, fullgraph=True, backend="aot_eager")(*args)
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_compile_fullgraph_inductor_matches_eager():
    args = _small(64, 4096)[:5]
    eager = _layer(*args)
    compiled = torch.compile(_layer, fullgraph=True)(*args)
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)


def _pre_f64(residual, fn, scale, base, **kw):
    """mhc_pre in float64 by torch ops: an independent reference for the gradients."""
    from kernelnotes.mhc.torch_reference import gates_torch

    T, _, H = residual.shape
    x = residual.reshape(T, -1)
    rstd = torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    pre, post, comb = gates_torch((x @ fn.T) * rstd, scale, base, **kw)
    return (pre[:, :, None] * residual).sum(1), post, comb


def _post_f64(x, residual, post, comb):
    return post[:, :, None] * x[:, None, :] + torch.einsum("tjk,tjh->tkh", comb, residual)


def test_backward_formulas_pass_gradcheck_in_float64():
    """The backward's formulas (torch_reference.mhc_pre_vjp_torch, mhc_post_vjp_torch; the
    Triton backward computes these) are torch ops of any dtype: in float64, beside the float64
    forward, torch.autograd.gradcheck checks them against finite differences."""
    residual, fn, scale, base, x, post, comb = (t.detach().cpu().double() for t in _small(2, 4))
    kw = dict(rms_eps=1e-6, pre_eps=1e-6, sinkhorn_eps=1e-6, post_mult=2.0, sinkhorn_iters=20)

    class Pre(torch.autograd.Function):
        @staticmethod
        def forward(ctx, residual, fn, scale, base):
            ctx.save_for_backward(residual, fn, scale, base)
            return _pre_f64(residual, fn, scale, base, pre_eps=1e-6, sinkhorn_eps=1e-6,
                            post_mult=2.0, sinkhorn_iters=20)

        @staticmethod
        def backward(ctx, *grads):
            return mhc_pre_vjp_torch(*ctx.saved_tensors, *grads, **kw)

    class Post(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            ctx.save_for_backward(*args)
            return _post_f64(*args)

        @staticmethod
        def backward(ctx, grad):
            return mhc_post_vjp_torch(*ctx.saved_tensors, grad)

    pre_in = [t.clone().requires_grad_() for t in (residual, fn, scale, base)]
    assert torch.autograd.gradcheck(Pre.apply, pre_in, eps=1e-6, atol=1e-6, fast_mode=True)
    post_in = [t.clone().requires_grad_() for t in (x, residual, post, comb)]
    assert torch.autograd.gradcheck(Post.apply, post_in, eps=1e-6, atol=1e-6, fast_mode=True)


def _grads(pre, post_fn, ins, cot_li, cot_out):
    li, post, comb = pre(*ins[:4])
    out = post_fn(ins[4], ins[0], post, comb)
    ((li.double() * cot_li).sum() + (out.double() * cot_out).sum()).backward()
    return [t.grad for t in ins]


def _grads_vs_float64(T, H, seed=3):
    """Gradients of a layer (mhc_pre, then mhc_post of its gates) with respect to residual, fn,
    scale, base and x: the custom ops', eager autograd's of the float32 torch reference, and
    float64 autograd's of an independent reference, all on the same (rounded) inputs."""
    residual, fn, scale, base = make_inputs(T, H, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).bfloat16().to(DEVICE)
    cot_li = torch.randn(T, H, generator=g, dtype=torch.float64).to(DEVICE)
    cot_out = torch.randn(T, 4, H, generator=g, dtype=torch.float64).to(DEVICE)
    leaves = lambda dtype=None: [(t.detach() if dtype is None else t.detach().to(dtype))  # noqa: E731
                                 .requires_grad_() for t in (residual, fn, scale, base, x)]
    ours = _grads(mhc_pre, mhc_post, leaves(), cot_li, cot_out)
    eager = _grads(mhc_pre_torch, mhc_post_torch, leaves(), cot_li, cot_out)
    want = _grads(_pre_f64, _post_f64, leaves(torch.float64), cot_li, cot_out)
    return list(zip(("residual", "fn", "scale", "base", "x"), ours, eager, want, strict=True))


def test_gradients_match_float64_autograd():
    # The residual's and x's gradients come back in bf16 (the inputs' dtype): one bf16 rounding,
    # u_bf16 relative. fn's, scale's and base's are fp32, but layer_input is bf16, so its
    # gradient arrives rounded to bf16 (2^-9), in the op as in eager autograd of the float32
    # torch reference, which rounds its output the same way: held to a multiple of its error.
    for name, got, eager, want in _grads_vs_float64(3, 40):
        if name in ("residual", "x"):
            assert rel_err(got, want) < TOL_BF16, name
        else:
            assert rel_err(got, want) < 4 * rel_err(eager, want) + 1e-5, name


@pytest.mark.gpu
def test_gradients_match_float64_autograd_at_full_size():
    for name, got, eager, want in _grads_vs_float64(1024, 7168):
        if name in ("residual", "x"):
            assert rel_err(got, want) < TOL_BF16, name
        else:
            assert rel_err(got, want) < 4 * rel_err(eager, want) + 1e-5, name


BWD_KW = dict(rms_eps=1e-6, pre_eps=1e-6, sinkhorn_eps=1e-6, post_mult=2.0, sinkhorn_iters=20)
# The backward's float32 outputs: fn's, scale's and base's gradients go through the projection's
# mixes (fn carried as two bf16 parts) and fp32 autograd of 20 Sinkhorn steps: the forward's
# TOL_GATES_PROJECTED. post's and comb's are fp32 sums of H products of bf16 values: 64 u.
TOL_BWD = {"pre": (TOL_BF16, TOL_GATES_PROJECTED, TOL_GATES_PROJECTED, TOL_GATES_PROJECTED),
           "post": (TOL_BF16, TOL_BF16, TOL_GATES, TOL_GATES)}


def _bwd_inputs(T, H, seed=7):
    """The inputs of both backwards and the cotangents of every output."""
    residual, fn, scale, base = make_inputs(T, H, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).bfloat16()
    post = 2 * torch.rand(T, 4, generator=g)
    comb = torch.softmax(torch.randn(T, 4, 4, generator=g), -1)
    g_li = torch.randn(T, H, generator=g).bfloat16()
    g_post, g_comb = torch.randn(T, 4, generator=g), torch.randn(T, 4, 4, generator=g)
    g_out = torch.randn(T, 4, H, generator=g).bfloat16()
    rest = [t.to(DEVICE) for t in (x, post, comb, g_li, g_post, g_comb, g_out)]
    return residual, fn, scale, base, *rest


@pytest.mark.parametrize("T,H", SHAPES + [pytest.param(*s, marks=pytest.mark.gpu)
                                          for s in ((8192, 7168), (1024, 4096), (3, 1000))])
def test_backward_kernels_write_every_element_and_match_float64(T, H, monkeypatch):
    """The Triton backward (kernel._pre_backward, _post_backward) against its formulas in float64
    on the same inputs, every allocation NaN-poisoned (the recomputed projection's, the token
    splits' fn-gradient parts, the outputs): T and H leave masked tails in every tile, and in
    the pre pass's token splits."""
    residual, fn, scale, base, x, post, comb, g_li, g_post, g_comb, g_out = _bwd_inputs(T, H)
    poison_allocations(monkeypatch)
    # two token splits of the pre pass (the default gives one at the CPU's sizes); at T = 33 the
    # first has two token blocks (16 a block under the interpreter), the second one
    got = {"pre": K._pre_backward(residual, fn, scale, base, g_li, g_post, g_comb, t_splits=2,
                                  **BWD_KW),
           "post": K._post_backward(x, residual, post, comb, g_out)}
    monkeypatch.undo()
    f64 = lambda *ts: [t.double() for t in ts]  # noqa: E731
    want = {"pre": mhc_pre_vjp_torch(*f64(residual, fn, scale, base, g_li, g_post, g_comb),
                                     **BWD_KW),
            "post": mhc_post_vjp_torch(*f64(x, residual, post, comb, g_out))}
    for op in ("pre", "post"):
        for i, (a, b, tol) in enumerate(zip(got[op], want[op], TOL_BWD[op], strict=True)):
            assert a.shape == b.shape and not a.isnan().any(), (op, i)
            assert rel_err(a, b) < tol, (op, i, rel_err(a, b))


def _gates_grads_autograd(dot, sq, H, scale, base, cots, dtype, **kw):
    """(g_dot, g_sq, pre, g_scale, g_base) by autograd of the torch reference's gates in dtype."""
    from kernelnotes.mhc.torch_reference import gates_torch

    d, q, sc, b = (t.detach().to(dtype).requires_grad_() for t in (dot, sq, scale, base))
    rstd = torch.rsqrt(q / (4 * H) + kw["rms_eps"])
    pre, post, comb = gates_torch(d * rstd[:, None], sc, b, pre_eps=kw["pre_eps"],
                                  sinkhorn_eps=kw["sinkhorn_eps"], post_mult=kw["post_mult"],
                                  sinkhorn_iters=kw["sinkhorn_iters"])
    outs = [o for o, c in zip((pre, post, comb), cots, strict=True) if c is not None]
    grads = torch.autograd.grad(outs, (d, q, sc, b), [c.to(dtype) for c in cots if c is not None])
    return grads[0], grads[1], pre.detach(), grads[2], grads[3]


@pytest.mark.parametrize("T,iters,logit", [(7, 20, 1.0), (5, 1, 1.0), (9, 2, 1.0), (6, 20, 30.0)]
                         + [pytest.param(8193, 20, 1.0, marks=pytest.mark.gpu)])
def test_gates_backward_kernel_matches_float64_autograd(T, iters, logit, monkeypatch):
    """The gates' backward kernel (the Sinkhorn iterations taken back one by one from the inputs
    it stored on the way forward) against float64 autograd of the torch reference's gates, with
    NaN-poisoned allocations, T not a multiple of the token block, one and two Sinkhorn
    iterations, logits of 30 (saturated sigmoids, a near-one-hot softmax) and an unused output
    (post's gradient None). Held to 4 times float32 autograd's own error."""
    H = 40
    g = torch.Generator().manual_seed(T)
    dot = (logit * torch.randn(T, 24, generator=g) * (4 * H) ** 0.5).to(DEVICE)
    sq = (4 * H * (0.5 + torch.rand(T, generator=g))).to(DEVICE)
    scale = (1 + 0.1 * torch.randn(3, generator=g)).to(DEVICE)
    base = (0.3 * torch.randn(24, generator=g)).to(DEVICE)
    g_pre, g_comb = (torch.randn(s, generator=g).to(DEVICE) for s in ((T, 4), (T, 4, 4)))
    kw = dict(BWD_KW, sinkhorn_iters=iters)
    for g_post in (torch.randn(T, 4, generator=g).to(DEVICE), None):
        poison_allocations(monkeypatch)
        got = K._gates_backward(dot, sq, g_pre, H, scale, base, g_post, g_comb, **kw)
        monkeypatch.undo()
        cots = (g_pre, g_post, g_comb)
        want = _gates_grads_autograd(dot, sq, H, scale, base, cots, torch.float64, **kw)
        eager = _gates_grads_autograd(dot, sq, H, scale, base, cots, torch.float32, **kw)
        for name, a, w, e in zip(("g_dot", "g_sq", "pre", "g_scale", "g_base"), got, want, eager,
                                 strict=True):
            assert a.shape == w.shape and not a.isnan().any(), name
            assert rel_err(a, w) <= 4 * rel_err(e, w) + 4 * U32, (name, rel_err(a, w),
                                                                  rel_err(e, w))


def test_backward_takes_expanded_and_missing_gradients():
    """``loss.sum().backward()`` hands the ops an expanded (stride-0) gradient, and a loss of one
    of mhc_pre's outputs leaves the other two gradients None: each gives the formulas' gradients
    (float64) for those cotangents."""
    residual, fn, scale, base, x, post, comb, *_ = _bwd_inputs(5, 40)
    T, _, H = residual.shape
    f64 = lambda *ts: [t.double() for t in ts]  # noqa: E731
    for which in ("layer_input", "post_mix"):
        r, f = residual.clone().requires_grad_(), fn.clone().requires_grad_()
        out = mhc_pre(r, f, scale, base)
        getattr(out, which).sum().backward()
        ones = torch.ones_like(getattr(out, which), dtype=torch.float64)
        cots = (ones, None, None) if which == "layer_input" else (None, ones, None)
        want = mhc_pre_vjp_torch(*f64(residual, fn, scale, base), *cots, **BWD_KW)
        assert rel_err(r.grad, want[0]) < TOL_BF16, which
        assert rel_err(f.grad, want[1]) < TOL_GATES_PROJECTED, which
    ins = [t.clone().requires_grad_() for t in (x, residual, post, comb)]
    mhc_post(*ins).sum().backward()
    want = mhc_post_vjp_torch(*f64(x, residual, post, comb),
                              torch.ones(T, 4, H, dtype=torch.float64, device=DEVICE))
    for t, w, tol in zip(ins, want, TOL_BWD["post"], strict=True):
        assert rel_err(t.grad, w) < tol


def test_split_fn_refuses_to_drop_a_gradient():
    fn = make_inputs(2, 16)[1].requires_grad_()
    with pytest.raises(RuntimeError, match="mhc_split_fn has no backward"):
        split_fn(fn)
    with torch.no_grad():
        assert split_fn(fn).shape == (2, 24, 64)


def test_split_fn_parts_get_fns_gradient():
    """fn = hi + lo: given the parts, mhc_pre gives each part the gradient that fn would get."""
    residual, fn, scale, base = make_inputs(2, 16)
    parts = split_fn(fn).requires_grad_()
    f = fn.clone().requires_grad_()
    mhc_pre(residual, parts, scale, base).layer_input.float().sum().backward()
    mhc_pre(residual, f, scale, base).layer_input.float().sum().backward()
    assert rel_err(parts.grad[0].float(), f.grad) < TOL_BF16
    assert torch.equal(parts.grad[0], parts.grad[1])


def test_from_mixes_gradients_match_float64_autograd():
    from kernelnotes.mhc.torch_reference import gates_torch

    T, H = 3, 24
    residual, fn, scale, base = make_inputs(T, H, seed=5)
    flat = residual.flatten(1).float()
    dot = torch.stack([flat[:, :48] @ fn[:, :48].T, flat[:, 48:] @ fn[:, 48:].T])
    sq = torch.stack([flat[:, :48].square().sum(-1), flat[:, 48:].square().sum(-1)])
    ins = [t.clone().requires_grad_() for t in (dot, sq, residual, scale, base)]
    li, post, comb = mhc_pre_from_mixes(*ins)
    cot = torch.randn(T, H, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    ((li.float() * cot).sum() + post.sum() + (comb * comb).sum()).backward()
    def reference(dtype):
        ref = [t.detach().to(dtype).requires_grad_() for t in (dot, sq, residual, scale, base)]
        rstd = torch.rsqrt(ref[1].sum(0) / (4 * H) + 1e-6)
        pre_r, post_r, comb_r = gates_torch(ref[0].sum(0) * rstd[:, None], ref[3], ref[4])
        li_r = (pre_r[:, :, None] * ref[2].to(pre_r.dtype)).sum(1)
        if dtype == torch.float32:  # a bf16 output, as the op's: its gradient arrives in bf16
            li_r = li_r.bfloat16().float()
        ((li_r * cot.to(dtype)).sum() + post_r.sum() + (comb_r * comb_r).sum()).backward()
        return [t.grad for t in ref]

    # layer_input is bf16, so its gradient arrives rounded to bf16 (2^-9), in the op as in a
    # float32 reference that rounds its output the same way: held to a multiple of that one's
    want, eager = reference(torch.float64), reference(torch.float32)
    for name, a, b, e in zip(("dot_mix", "sqrsum", "residual", "scale", "base"), ins, want, eager,
                             strict=True):
        tol = TOL_BF16 if name == "residual" else 4 * rel_err(e, b) + 1e-5
        assert rel_err(a.grad, b) < tol, name


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



