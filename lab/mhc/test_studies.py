"""The mHC one-pass design studies (lab/mhc/onepass.py, pipelined.py): refusals and sm_90
compiles on any machine, correctness against the float64 NumPy reference on a Hopper GPU.

Not collected by CI (pyproject's testpaths are tests and docs): run
``pytest lab/mhc/test_studies.py`` from the repository root. The helpers below are copied
from tests/ so that the lab depends on the package's public API only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernelnotes.mhc import reference as R

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
TOL_BF16 = 2.0**-8
TOL_GATES_PROJECTED = 1e-4


def rel_err(got, ref) -> float:
    got = np.asarray(got.detach().cpu().double() if isinstance(got, torch.Tensor) else got)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def poison_allocations(monkeypatch) -> None:
    """Every torch.empty / empty_like allocation starts NaN (integers: -1), so an output element
    a kernel fails to write shows."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan") if t.is_floating_point() else -1)

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(real_empty_like(*a, **kw)))


def compiled_offline(code: str):
    """The JSON that python code prints last, run without Triton's interpreter, with src/ and
    the repository on its path: where triton.compile builds sm_90 code without a GPU."""
    root = Path(__file__).resolve().parents[2]
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root)])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_inputs(T, H, seed=0, *, logit_scale=1.0):
    """residual [T, 4, H] bf16 and fn, scale, base with O(logit_scale) logits."""
    g = torch.Generator().manual_seed(seed)
    K = 4 * H
    residual = (torch.randn(T, 4, H, generator=g) * (1 + 0.1 * torch.arange(4))[:, None]).bfloat16()
    fn = torch.randn(24, K, generator=g) / K**0.5
    scale = logit_scale * (1 + 0.1 * torch.randn(3, generator=g))
    base = 0.3 * torch.randn(24, generator=g)
    return [t.to(DEVICE) for t in (residual, fn, scale, base)]


def f64(t):
    return t.detach().cpu().double().numpy()


def check_pre(got, ref, tol_gates):
    li, post, comb = got
    assert li.dtype == torch.bfloat16 and post.dtype == comb.dtype == torch.float32
    errs = [rel_err(g, r) for g, r in zip(got, ref, strict=True)]
    assert errs[0] < TOL_BF16, errs
    assert errs[1] < tol_gates and errs[2] < tol_gates, errs


# ------------------------------------------------------- one-pass design study (Gluon, Hopper)
def onepass():
    from lab.mhc import onepass as op

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
from lab.mhc import onepass as op
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
    from lab.mhc import pipelined as pp

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
from lab.mhc import pipelined as pp
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
