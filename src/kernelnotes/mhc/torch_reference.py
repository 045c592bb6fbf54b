"""The float32 PyTorch reference of DeepSeek-V4's ``hc_pre`` / ``hc_post``: the eager peer.

What a model without fused kernels runs (V4 ``inference/model.py`` Block.hc_pre / hc_post, as
restated in the project's mHC spec): fp32 GEMM, RMS, gates, 20 Sinkhorn iterations, an fp32
weighted sum rounded to bf16. The benchmark times it eager and under ``torch.compile``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sinkhorn_torch(c: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb from logits c[..., j, k]: softmax over k + eps, then column/row normalisations."""
    c = torch.softmax(c, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def gates_torch(mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
                pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6, post_mult: float = 2.0,
                sinkhorn_iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pre [T, 4], post [T, 4] and comb [T, 4, 4] from the normalised mixes [T, 24].

    Args:
        mix: RMSNorm(vec X) fn^T, [T, 24] float32 (or float64), slots [pre | post | comb].
        scale: [3] (alpha_pre, alpha_post, alpha_res); base: [24], the static part.
        pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters: as ``kernelnotes.mhc.mhc_pre``.
    Returns:
        (pre, post, comb), in mix's dtype; differentiable by autograd.
    """
    pre = torch.sigmoid(mix[:, 0:4] * scale[0] + base[0:4]) + pre_eps
    post = post_mult * torch.sigmoid(mix[:, 4:8] * scale[1] + base[4:8])
    comb = sinkhorn_torch((mix[:, 8:] * scale[2] + base[8:]).view(-1, 4, 4), sinkhorn_iters,
                          sinkhorn_eps)
    return pre, post, comb


def mhc_pre_torch(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor,
                  base: torch.Tensor, rms_eps: float = 1e-6, pre_eps: float = 1e-6,
                  sinkhorn_eps: float = 1e-6, post_mult: float = 2.0, sinkhorn_iters: int = 20
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """residual [T, 4, H] bf16, fn [24, 4H] fp32 -> layer_input [T, H] bf16, post [T, 4], comb."""
    x = residual.flatten(1).float()  # [T, 4H]
    rstd = torch.rsqrt(x.square().mean(-1, keepdim=True) + rms_eps)
    mix = F.linear(x, fn) * rstd  # [T, 24]
    pre, post, comb = gates_torch(mix, scale, base, pre_eps=pre_eps, sinkhorn_eps=sinkhorn_eps,
                                  post_mult=post_mult, sinkhorn_iters=sinkhorn_iters)
    layer_input = (pre[:, :, None] * residual.float()).sum(1).bfloat16()
    return layer_input, post, comb


def mhc_pre_from_mixes_torch(dot_mix: torch.Tensor, sqrsum: torch.Tensor,
                             residual: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                             rms_eps: float = 1e-6, pre_eps: float = 1e-6,
                             sinkhorn_eps: float = 1e-6, post_mult: float = 2.0,
                             sinkhorn_iters: int = 20
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same from dot_mix [S, T, 24] and sqrsum [S, T] (FlashInfer's test reference)."""
    k = 4 * residual.shape[-1]
    rstd = torch.rsqrt(sqrsum.sum(0)[:, None] / k + rms_eps)
    mix = dot_mix.sum(0) * rstd
    pre, post, comb = gates_torch(mix, scale, base, pre_eps=pre_eps, sinkhorn_eps=sinkhorn_eps,
                                  post_mult=post_mult, sinkhorn_iters=sinkhorn_iters)
    layer_input = (pre[:, :, None] * residual.float()).sum(1).bfloat16()
    return layer_input, post, comb


def mhc_post_torch(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
                   comb_mix: torch.Tensor) -> torch.Tensor:
    """out[t, k] = post[t, k] x[t] + sum_j comb[t, j, k] residual[t, j], in fp32, then bf16."""
    mixed = torch.einsum("tjk,tjh->tkh", comb_mix, residual.float())
    return (post_mix[:, :, None] * x.float()[:, None, :] + mixed).bfloat16()
