"""Tests of the FlashAttention-3-style design study (lab/attention/fa3_gluon.py). Not collected by
CI (pyproject's testpaths are tests/ and docs/): run ``pytest lab/attention/test_fa3_gluon.py``
from the repository root; the GPU tests need a Hopper GPU (``-m gpu``), and
``test_fa3_timing_table`` prints its table with ``-s``."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from tests._machine import ON_GPU
from tests._offline import compiled_offline

DTYPES = (torch.bfloat16, torch.float16)
ERR_FACTOR = 2.0  # o may be this many times as far from float64 as SDPA's own output
LSE_REL_TOL = 1e-4  # lse comes from fp32 scores: a dropped tile or a wrong mask moves it ~1e-2


def fa3():
    from lab.attention import fa3_gluon

    return fa3_gluon


def rel_err(got, ref) -> float:
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm())


def rand(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return t.to(dtype).to("cuda" if ON_GPU else "cpu")


def reference(q, k, v, causal: bool, scale: float):
    """float64 attention of the (already rounded) inputs: o [B, H, N, D] and lse [B, H, N]."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = q.shape[-2]
        keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


# ------------------------------------------------------------------------------------ any machine
def test_fa3_refuses_what_it_does_not_take():
    """Each refusal names its argument; the shape and dtype checks come before the device check,
    so a CPU tensor that passes them is refused for being on the CPU."""
    m = fa3()
    good = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    cases = [
        ((good.float(), good.float(), good.float()), {}, r"q has dtype torch.float32"),
        ((good, good.half(), good), {}, r"k must have q's dtype"),
        ((torch.zeros(1, 2, 256, 96, dtype=torch.bfloat16),) * 3, {}, r"q has head dim D=96"),
        ((torch.zeros(1, 2, 200, 64, dtype=torch.bfloat16),) * 3, {},
         r"q has sequence length N=200"),
        ((good, good[:, :, :128], good), {}, r"k must have q's shape"),
        ((good.transpose(2, 3).contiguous().transpose(2, 3), good, good), {},
         r"q must be contiguous"),
        ((good, good, good), dict(causal=1), r"causal must be a bool"),
        ((good, good, good), dict(sm_scale=-1.0), r"sm_scale must be"),
        ((good, good, good), dict(config=(64, 128, 2, True)), r"config must be a Config"),
        ((good, good, good), {}, r"q is on cpu: attention_fa3 needs CUDA tensors"),
    ]
    for args, kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            m.attention_fa3(*args, **kw)


def test_fa3_compiles_for_sm90_without_a_gpu():
    """Under Triton 3.6 (the GPU machine's version): every configuration compiles for sm_90 at
    D = 64 and 128, causal (the longer path), in 12 warps (the producer's warp padded to a
    warpgroup), with setmaxnreg giving the consumers 240 registers and the producer 24, no spills,
    and its tiles within a block's shared memory. Under another Triton the module still imports
    and refuses a CPU tensor (lab/attention/aot_check.py also compiles under 3.9)."""
    import triton

    m = fa3()
    if not triton.__version__.startswith("3.6."):
        x = torch.zeros(1, 1, 128, 64, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="q is on cpu"):
            m.attention_fa3(x, x, x)
        assert m.CONFIGS and callable(m.attention_fa3)
        return
    code = r"""
import json
from lab.attention import aot_check, fa3_gluon as m
rows = [aot_check.compile_one(cfg, d, True) for cfg in m.CONFIGS for d in m.HEAD_DIMS]
print(json.dumps(rows))
"""
    rows = compiled_offline(code)
    assert len(rows) == len(m.CONFIGS) * len(m.HEAD_DIMS)
    for r in rows:
        assert r["ok"], r
        assert r["warps"] == 12 and {240, 24} <= set(r["setmaxnreg"]), r
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
        cfg = m.Config(**r["config"])
        assert cfg.shared_bytes(r["head_dim"]) <= r["shared"] <= m.MAX_SHARED_BYTES, r


# ------------------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.parametrize("n", [256, 1024])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t).removeprefix("torch."))
def test_fa3_matches_float64(dtype, d, causal, n, monkeypatch):
    """o within ERR_FACTOR of SDPA's own error against float64, lse within LSE_REL_TOL, every
    element written (outputs allocated NaN-filled), for the default configuration."""
    m = fa3()
    B, H = 2, 3
    q, k, v = (rand(B, H, n, d, dtype=dtype, seed=s) for s in (1, 2, 3))
    scale = 1.0 / math.sqrt(d)
    o_ref, lse_ref = reference(q, k, v, causal, scale)
    sdpa_err = rel_err(F.scaled_dot_product_attention(q, k, v, is_causal=causal), o_ref)
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty_like",
                        lambda *a, **kw: empty_like(*a, **kw).fill_(float("nan")))
    o, lse = m.attention_fa3(q, k, v, causal=causal)
    monkeypatch.undo()
    torch.cuda.synchronize()
    assert o.dtype == dtype and o.shape == q.shape and lse.dtype == torch.float32
    assert lse.shape == (B, H, n)
    assert not o.isnan().any() and not lse.isnan().any()
    assert rel_err(o, o_ref) <= ERR_FACTOR * sdpa_err, (rel_err(o, o_ref), sdpa_err)
    assert rel_err(lse, lse_ref) <= LSE_REL_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_fa3_every_config_matches_float64(d, causal):
    """Every entry of CONFIGS (the ring depth, overlap on and off) at N = 1024, with sm_scale
    given, against float64; and the default configuration against the product's forward."""
    from kernelnotes.attention import flash_attn_fwd

    m = fa3()
    q, k, v = (rand(1, 4, 1024, d, dtype=torch.bfloat16, seed=s) for s in (4, 5, 6))
    scale = 0.3
    o_ref, lse_ref = reference(q, k, v, causal, scale)
    sdpa_err = rel_err(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
                       o_ref)
    for cfg in m.CONFIGS:
        o, lse = m.attention_fa3(q, k, v, causal=causal, sm_scale=scale, config=cfg)
        assert rel_err(o, o_ref) <= ERR_FACTOR * sdpa_err, (cfg, rel_err(o, o_ref), sdpa_err)
        assert rel_err(lse, lse_ref) <= LSE_REL_TOL, cfg
    o, lse = m.attention_fa3(q, k, v, causal=causal, sm_scale=scale)
    o2, lse2 = flash_attn_fwd(q, k, v, causal=causal, sm_scale=scale)
    assert rel_err(o, o2) <= ERR_FACTOR * sdpa_err
    assert rel_err(lse, lse2) <= LSE_REL_TOL


def _timed_rows(m, d: int, n: int, causal: bool) -> list[dict]:
    """TFLOP/s of every configuration, the product's forward and cuDNN's SDPA at one shape."""
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernelnotes.attention import flash_attn_fwd

    b, h = 65536 // n, 16
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * b * h * n * n * d / (2 if causal else 1)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    fns = {"product flash_attn_fwd": lambda: flash_attn_fwd(q, k, v, causal)[0]}
    o_ref = fns["product flash_attn_fwd"]()
    for cfg in m.CONFIGS:
        fns[f"fa3 {tuple(cfg)}"] = lambda cfg=cfg: m.attention_fa3(q, k, v, causal, config=cfg)[0]
        assert rel_err(fns[f"fa3 {tuple(cfg)}"]()[:1], o_ref[:1]) < 2e-2, cfg
    try:
        cudnn()
        fns["cudnn sdpa"] = cudnn
    except RuntimeError:  # no cuDNN attention in this torch build
        pass
    rows = []
    for name, fn in fns.items():
        ms = triton.testing.do_bench(fn, warmup=25, rep=100)
        rows.append(dict(kernel=name, D=d, N=n, B=b, H=h, causal=causal, ms=round(ms, 4),
                         tflops=round(flops / ms / 1e9, 1)))
    return rows


@pytest.mark.gpu
def test_fa3_timing_table():
    """Not a pass/fail on speed: times every configuration beside the product's forward and
    cuDNN's SDPA at the benchmark's shapes (bf16, B * N = 65536, H = 16), prints TFLOP/s (with
    -s), and writes the rows as JSON to $FA3_TIMINGS if that is set. Each configuration's output
    is first checked loosely against the product's forward, so a wrong kernel is not timed."""
    m = fa3()
    rows = [r for d in (64, 128) for n in (1024, 4096, 16384) for causal in (False, True)
            for r in _timed_rows(m, d, n, causal)]
    print()
    for r in rows:
        print(f"D={r['D']:3d} N={r['N']:5d} causal={int(r['causal'])}  {r['kernel']:32s} "
              f"{r['ms']:8.3f} ms {r['tflops']:7.1f} TFLOP/s")
    if os.environ.get("FA3_TIMINGS"):
        with open(os.environ["FA3_TIMINGS"], "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    assert rows
