"""The float32 PyTorch reference of DeepSeek-V4's ``hc_pre`` / ``hc_post``: the eager peer.

What a model without fused kernels runs (V4 ``inference/model.py`` Block.hc_pre / hc_post, as
restated in the project's mHC spec): fp32 GEMM, RMS, gates, 20 Sinkhorn iterations, an fp32
weighted sum rounded to bf16. The benchmark times it eager and under ``torch.compile``. Beside
it, the backward's formulas written with torch ops (``mhc_pre_vjp_torch``, ``mhc_post_vjp_torch``),
which the Triton backward computes.
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


# --8<-- [start:pre_vjp]
def mhc_pre_vjp_torch(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor,
                      base: torch.Tensor, g_li: torch.Tensor | None, g_post: torch.Tensor | None,
                      g_comb: torch.Tensor | None, rms_eps: float = 1e-6, pre_eps: float = 1e-6,
                      sinkhorn_eps: float = 1e-6, post_mult: float = 2.0,
                      sinkhorn_iters: int = 20) -> tuple[torch.Tensor, ...]:
    """mhc_pre's backward written out, in residual's dtype or float32: (g_residual, g_fn,
    g_scale, g_base) from the gradients of (layer_input, post, comb), None for an unused one.

    With x = vec(X_l): dot = x fn^T and sq = |x|^2; the 24 gates a token go back through
    autograd (g_dot, g_sq); then g_x = g_dot fn + 2 g_sq x + pre (x) g_layer_input and
    g_fn = g_dot^T x. The formulas mhc_pre's Triton backward computes.
    """
    T, n, H = residual.shape
    acc = torch.float64 if residual.dtype == torch.float64 else torch.float32
    X = residual.to(acc)  # [T, 4, H]
    x, w = X.reshape(T, n * H), fn.to(acc)
    g_li = torch.zeros((T, H), dtype=acc, device=x.device) if g_li is None else g_li.to(acc)
    g_post = (torch.zeros((T, n), dtype=acc, device=x.device) if g_post is None
              else g_post.to(acc).reshape(T, n))
    g_comb = (torch.zeros((T, n, n), dtype=acc, device=x.device) if g_comb is None
              else g_comb.to(acc))
    g_pre = torch.einsum("tjh,th->tj", X, g_li)  # layer_input = sum_j pre_j X_j
    with torch.enable_grad():
        dot, sq = (t.detach().requires_grad_() for t in (x @ w.T, x.square().sum(-1)))
        sc, b = (t.detach().to(acc).requires_grad_() for t in (scale, base))
        rstd = torch.rsqrt(sq / (n * H) + rms_eps)
        pre, post, comb = gates_torch(dot * rstd[:, None], sc, b, pre_eps=pre_eps,
                                      sinkhorn_eps=sinkhorn_eps, post_mult=post_mult,
                                      sinkhorn_iters=sinkhorn_iters)
        g_dot, g_sq, g_scale, g_base = torch.autograd.grad(
            (pre, post, comb), (dot, sq, sc, b), (g_pre, g_post, g_comb))
    g_x = g_dot @ w + 2 * g_sq[:, None] * x + (pre.detach()[:, :, None] * g_li[:, None, :]
                                                 ).reshape(T, n * H)
    g_fn = g_dot.T @ x
    return (g_x.reshape(T, n, H).to(residual.dtype), g_fn.to(fn.dtype), g_scale.to(scale.dtype),
            g_base.to(base.dtype))
# --8<-- [end:pre_vjp]


# --8<-- [start:post_vjp]
def mhc_post_vjp_torch(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
                       comb_mix: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """mhc_post's backward written out, from out[k] = post[k] x + sum_j comb[j][k] X[j]:
    g_x = sum_k post[k] g[k], g_X[j] = sum_k comb[j][k] g[k], g_post[k] = <g[k], x>,
    g_comb[j][k] = <X[j], g[k]>, each in its input's dtype."""
    acc = torch.float64 if residual.dtype == torch.float64 else torch.float32
    g, xf, X = grad.to(acc), x.to(acc), residual.to(acc)
    post, comb = post_mix.to(acc).reshape(g.shape[0], -1), comb_mix.to(acc)
    g_x = torch.einsum("tk,tkh->th", post, g)
    g_res = torch.einsum("tjk,tkh->tjh", comb, g)
    g_post = torch.einsum("tkh,th->tk", g, xf).reshape(post_mix.shape)
    g_comb = torch.einsum("tjh,tkh->tjk", X, g)
    return (g_x.to(x.dtype), g_res.to(residual.dtype), g_post.to(post_mix.dtype),
            g_comb.to(comb_mix.dtype))
# --8<-- [end:post_vjp]
