"""Manifold-constrained hyper-connections (mHC) in NumPy, float64, one token at a time.

The layer (DeepSeek-V4 report eq. 1; Xie et al. 2025, arXiv:2512.24880, eq. 3) on the residual
state X in R^{n x d}, n = 4 streams:

    X_{l+1} = B_l X_l + C_l F_l(A_l X_l)

with A_l = pre (1 x n), C_l = post (n x 1) and B_l = comb^T (n x n) produced per token from X_l
itself (docs/posts/07-mhc-hyper-connections.md). Every function works on one token, and on
any leading batch dimensions by broadcasting. Defaults are DeepSeek-V4's.
"""

from __future__ import annotations

import numpy as np

N_HC = 4  # streams
N_MIX = N_HC * (2 + N_HC)  # 24 = 4 pre + 4 post + 16 comb
PRE, POST, COMB = slice(0, 4), slice(4, 8), slice(8, 24)  # the order every kernel uses


# --8<-- [start:sinkhorn]
def sinkhorn(logits: np.ndarray, iters: int = 20, eps: float = 1e-6) -> np.ndarray:
    """comb = Sinkhorn-Knopp(exp(logits)) as the kernels run it.

    Args:
        logits: [..., 4(j), 4(k)], comb's logits.
        iters: row + column normalisations (DeepSeek-V4: 20).
        eps: the floor after the softmax and in every denominator.

    Returns:
        comb [..., 4, 4]; B = comb^T is (almost) doubly stochastic.
    """
    c = np.exp(logits - logits.max(-1, keepdims=True))  # max-subtracted: no overflow
    c = c / c.sum(-1, keepdims=True) + eps  # softmax over k, then the floor eps  [..., 4, 4]
    c = c / (c.sum(-2, keepdims=True) + eps)  # column-normalise: sum over j
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdims=True) + eps)  # row-normalise: sum over k
        c = c / (c.sum(-2, keepdims=True) + eps)  # column-normalise: sum over j
    return c  # comb[j][k];  B = comb^T is (almost) doubly stochastic
# --8<-- [end:sinkhorn]


# --8<-- [start:gates]
def sigmoid(v: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-v)), elementwise."""
    return 1.0 / (1.0 + np.exp(-v))


def gates(mix: np.ndarray, scale: np.ndarray, base: np.ndarray, *, pre_eps: float = 1e-6,
          post_mult: float = 2.0, sinkhorn_iters: int = 20,
          sinkhorn_eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """pre [..., 4], post [..., 4], comb [..., 4, 4] from the normalised mixes [..., 24],
    scale [3] (alpha) and base [24] (S)."""
    pre = sigmoid(mix[..., PRE] * scale[0] + base[PRE]) + pre_eps  # A_l in (eps, 1+eps)  [..., 4]
    post = post_mult * sigmoid(mix[..., POST] * scale[1] + base[POST])  # C_l in (0, 2)  [..., 4]
    logits = (mix[..., COMB] * scale[2] + base[COMB]).reshape(*mix.shape[:-1], 4, 4)  # c[j][k]
    comb = sinkhorn(logits, sinkhorn_iters, sinkhorn_eps)  # [..., 4, 4]
    return pre, post, comb
# --8<-- [end:gates]


# --8<-- [start:mixes]
def mixes(X: np.ndarray, fn: np.ndarray, rms_eps: float = 1e-6) -> np.ndarray:
    """The 24 normalised mixes of one token: RMSNorm(vec(X)) W^fused, with W^fused = fn^T."""
    x = X.reshape(*X.shape[:-2], -1)  # vec(X_l)  [..., 4d]
    rstd = 1.0 / np.sqrt((x * x).mean(-1) + rms_eps)  # 1 / RMS(vec X)  [...]
    return (x @ fn.T) * rstd[..., None]  # (x fn^T)/RMS = RMSNorm(x) fn^T  [..., 24]
# --8<-- [end:mixes]


# --8<-- [start:mhc_pre]
def mhc_pre(X: np.ndarray, fn: np.ndarray, scale: np.ndarray, base: np.ndarray, *,
            rms_eps: float = 1e-6, **gate_kw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Everything before the sublayer: layer_input = A X, and post, comb for mhc_post."""
    pre, post, comb = gates(mixes(X, fn, rms_eps), scale, base, **gate_kw)
    layer_input = np.einsum("...j,...jh->...h", pre, X)  # A_l X_l  [..., d]
    return layer_input, post, comb
# --8<-- [end:mhc_pre]


# --8<-- [start:from_mixes]
def mhc_pre_from_mixes(dot_mix: np.ndarray, sqrsum: np.ndarray, X: np.ndarray,
                       scale: np.ndarray, base: np.ndarray, *, rms_eps: float = 1e-6,
                       **gate_kw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """mhc_pre from the raw projection dot_mix = vec(X) fn^T and sqrsum = |vec X|^2.

    Split-K partials carry a leading split axis ([S, ..., 24] and [S, ...]); they are summed.
    """
    if dot_mix.ndim == X.ndim:  # a leading split axis
        dot_mix, sqrsum = dot_mix.sum(0), sqrsum.sum(0)
    rstd = 1.0 / np.sqrt(sqrsum / (N_HC * X.shape[-1]) + rms_eps)  # k = 4d  [...]
    pre, post, comb = gates(dot_mix * rstd[..., None], scale, base, **gate_kw)
    return np.einsum("...j,...jh->...h", pre, X), post, comb
# --8<-- [end:from_mixes]


# --8<-- [start:mhc_post]
def mhc_post(F: np.ndarray, X: np.ndarray, post: np.ndarray, comb: np.ndarray) -> np.ndarray:
    """X_{l+1} = B X + C F with B = comb^T: new[k] = post[k] F + sum_j comb[j][k] X[j]."""
    return post[..., :, None] * F[..., None, :] + np.einsum("...jk,...jh->...kh", comb, X)
# --8<-- [end:mhc_post]


# --8<-- [start:layer]
def mhc_layer(X: np.ndarray, F, fn: np.ndarray, scale: np.ndarray, base: np.ndarray,
              **kw) -> np.ndarray:
    """One full mHC site: X_{l+1} = B_l X_l + C_l F(A_l X_l); F maps [..., d] -> [..., d]."""
    layer_input, post, comb = mhc_pre(X, fn, scale, base, **kw)
    return mhc_post(F(layer_input), X, post, comb)
# --8<-- [end:layer]


# --8<-- [start:split_k]
def project_split_k(X: np.ndarray, fn: np.ndarray,
                    splits: int) -> tuple[np.ndarray, np.ndarray]:
    """dot_mix and sqrsum in `splits` K-chunks, as a split-K GEMM writes them ([S, ..., 24])."""
    x = X.reshape(*X.shape[:-2], -1)  # [..., K]
    bounds = np.linspace(0, x.shape[-1], splits + 1).astype(int)
    chunks = list(zip(bounds[:-1], bounds[1:], strict=True))  # [a, b) of each split
    dot = np.stack([x[..., a:b] @ fn[:, a:b].T for a, b in chunks])
    sq = np.stack([(x[..., a:b] ** 2).sum(-1) for a, b in chunks])
    return dot, sq  # sum over the split axis = the full products
# --8<-- [end:split_k]


# --8<-- [start:amax_gain]
def amax_gain(M: np.ndarray) -> float:
    """max(largest |row| sum, largest |column| sum) of M: the forward and backward gain."""
    A = np.abs(M)
    return max(A.sum(-1).max(), A.sum(-2).max())
# --8<-- [end:amax_gain]


# --8<-- [start:bytes]
def bytes_per_token(op: str, H: int, S: int = 1) -> int:
    """Bytes an op must move per token (bf16 2 B, fp32 4 B): the roofline's numerator."""
    return {"mhc_pre": 8 * H + 2 * H + 16 + 64,  # read X once, write A X, post, comb
            "mhc_pre_from_mixes": 8 * H + 96 * S + 4 * S + 2 * H + 16 + 64,  # + dot_mix, sqrsum
            "mhc_post": 2 * H + 8 * H + 16 + 64 + 8 * H}[op]  # read F, X, post, comb; write X'
# --8<-- [end:bytes]
