"""CPU tests of design D, the Hopper backward in Gluon (lab/attention/bwd_gluon.py). Not collected
by CI (pyproject's testpaths are tests/ and docs/): run ``pytest lab/attention`` from the
repository root. No GPU test: the kernel has not run on a GPU yet and a deadlocked barrier would
stall the suite; lab/attention/bench_designs.py probes it in a child process with a time limit."""

from __future__ import annotations

import pytest
import torch
import triton

from tests._offline import compiled_offline


def bwd():
    from lab.attention import bwd_gluon

    return bwd_gluon


def _inputs(B=1, H=2, N=256, D=64, dtype=torch.bfloat16):
    q, k, v, o, do = (torch.randn(B, H, N, D, dtype=dtype) for _ in range(5))
    lse = torch.zeros(B, H, N, dtype=torch.float32)
    return do, q, k, v, o, lse


def test_refuses_cpu_tensors_after_the_shape_checks():
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        bwd().flash_bwd_hopper(*_inputs())


@pytest.mark.parametrize("change, error, match", [
    (lambda a: a.update(q=a["q"].float()), ValueError, "q has dtype"),
    (lambda a: a.update(k=a["k"][:, :1].contiguous()), ValueError, "k must have q's shape"),
    (lambda a: a.update(do=a["do"].half()), ValueError, "do must have q's dtype"),
    (lambda a: a.update(lse=a["lse"][..., :128]), ValueError, "lse must be float32"),
    (lambda a: a.update(o=a["o"].transpose(-1, -2).contiguous().transpose(-1, -2)), ValueError,
     "o must be contiguous"),
    (lambda a: a.update(causal=1), TypeError, "causal must be a bool"),
    (lambda a: a.update(sm_scale=-1.0), ValueError, "sm_scale must be"),
    (lambda a: a.update(q=None), TypeError, "q must be a torch.Tensor"),
])
def test_refusals_name_the_argument(change, error, match):
    do, q, k, v, o, lse = _inputs()
    args = dict(do=do, q=q, k=k, v=v, o=o, lse=lse, causal=False, sm_scale=None)
    change(args)
    with pytest.raises(error, match=match):
        bwd().flash_bwd_hopper(**args)


@pytest.mark.parametrize("D, N, match", [(48, 256, "head dim D=48"),
                                         (64, 200, "sequence length N=200")])
def test_refuses_head_dims_and_lengths_out_of_scope(D, N, match):
    with pytest.raises(ValueError, match=match):
        bwd().flash_bwd_hopper(*_inputs(N=N, D=D))


def test_shared_memory_of_each_config_fits_a_block():
    from kernelnotes.attention.hopper import MAX_SHARED_BYTES

    b = bwd()
    for D, cfg in b.CONFIGS.items():
        assert cfg.shared_bytes(D) <= MAX_SHARED_BYTES


def test_compiles_for_sm90_with_a_producer_warp_and_two_consumer_warpgroups():
    """Under Triton 3.6 (the GPU machine's): every head dim, causal and not, compiles with
    setmaxnreg 240 / 24 in the shared memory a block has; D = 64 without spills (D = 128 spilled
    48-60 bytes, NOTES.md). Under another Triton the module still imports and refuses a CPU
    tensor (the offline check is a 3.6 check)."""
    if not triton.__version__.startswith("3.6"):
        with pytest.raises(ValueError, match="cpu"):
            bwd().flash_bwd_hopper(*_inputs(N=128, D=64))
        return
    code = r"""
import json, os
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
from lab.attention import aot_check
print(json.dumps(aot_check.check_bwd()))
"""
    rows = compiled_offline(code)
    assert len(rows) == 4
    for r in rows:
        assert r["ok"], r
        assert {24, 240} <= set(r["setmaxnreg"])
        assert r["shared"] <= 227 * 1024
        if r["head_dim"] == 64:
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
