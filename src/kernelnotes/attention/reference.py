"""Attention and FlashAttention-2, written the way the post writes them (NumPy only).

Versions, each a named section the post includes and the tests run against each other:
``attention_naive`` (materialize S and P) -> ``flash_attention_forward`` (online softmax, the same
loops as the Triton kernel, optionally recording every inner step) -> ``flash_attention_backward``
(recomputation from the saved log-sum-exp). Shapes are [N, d] for one head; the functions also
broadcast over leading batch/head axes where noted. Causal masks are aligned top-left by default,
as PyTorch's ``is_causal``: query i may see key j when j <= i; ``alignment="bottom_right"`` gives
j <= i + (Nk - Nq), the convention of FlashAttention >= 2.1 (the last query sees every key).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

VERSIONS = ("attention_naive", "flash_attention_forward", "flash_attention_backward")
ALIGNMENTS = ("top_left", "bottom_right")


def _check_array(name: str, X, ndim: int | None = None) -> None:
    if not isinstance(X, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(X).__name__}")
    if not np.issubdtype(X.dtype, np.floating):
        raise TypeError(f"{name} must have a floating dtype, got {X.dtype}")
    if (X.ndim < 2 if ndim is None else X.ndim != ndim):
        want = "at least 2" if ndim is None else str(ndim)
        raise ValueError(f"{name} must have {want} dimensions, got shape {X.shape}")
    if X.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {X.shape}")


def _check_inputs(Q, K, V, causal, sm_scale, alignment, ndim: int | None = None) -> None:
    """Errors name the argument: arrays [..., N, d] of floats, Q and K of one d, K and V of one
    N, a bool flag, a finite scale or None, a known alignment."""
    for name, X in (("Q", Q), ("K", K), ("V", V)):
        _check_array(name, X, ndim)
    if K.shape[-1] != Q.shape[-1]:
        raise ValueError(f"K must have Q's head dim {Q.shape[-1]}, got shape {K.shape}")
    if V.shape[-2] != K.shape[-2]:
        raise ValueError(f"V must have K's {K.shape[-2]} rows, got shape {V.shape}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if sm_scale is not None and (isinstance(sm_scale, bool)
                                 or not isinstance(sm_scale, numbers.Real)):
        raise TypeError(f"sm_scale must be a real number or None, got {type(sm_scale).__name__}")
    if sm_scale is not None and not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale!r}")
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be 'top_left' or 'bottom_right', got {alignment!r}")


def _check_tiles(Br, Bc) -> None:
    for name, B in (("Br", Br), ("Bc", Bc)):
        if isinstance(B, bool) or not isinstance(B, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(B).__name__}")
        if B < 1:
            raise ValueError(f"{name} must be >= 1, got {B}")


def _check_saved(Q, V, O, dO, L) -> None:
    want = (Q.shape[0], V.shape[1])
    for name, X in (("O", O), ("dO", dO)):
        _check_array(name, X, 2)
        if X.shape != want:
            raise ValueError(f"{name} must have shape [Nq, dv] = {want}, got {X.shape}")
    _check_array("L", L, 1)
    if L.shape != (Q.shape[0],):
        raise ValueError(f"L must have shape [Nq] = ({Q.shape[0]},), got {L.shape}")


# --8<-- [start:naive]
def causal_mask(Nq: int, Nk: int, alignment: str = "top_left") -> np.ndarray:
    """True where query i may attend to key j: j <= i (top-left, as torch's is_causal), or
    j <= i + (Nk - Nq) (bottom-right)."""
    i = np.arange(Nq)[:, None]
    j = np.arange(Nk)[None, :]
    return j <= i + (Nk - Nq if alignment == "bottom_right" else 0)  # [Nq, Nk]


def attention_naive(Q: np.ndarray, K: np.ndarray, V: np.ndarray, causal: bool = False,
                    sm_scale: float | None = None,
                    alignment: str = "top_left") -> tuple[np.ndarray, np.ndarray]:
    """Standard attention O = softmax(σ Q Kᵀ [+ causal mask]) V, materializing S and P.

    Args:
        Q: [..., Nq, d] floats (leading axes broadcast).
        K: [..., Nk, d] floats.
        V: [..., Nk, dv] floats.
        causal: mask the future keys (a bool).
        sm_scale: σ, a finite number; None gives 1/sqrt(d).
        alignment: "top_left" (query i sees key j iff j <= i, torch's is_causal) or
            "bottom_right" (j <= i + Nk - Nq).

    Returns:
        O [..., Nq, dv] (rows that see no key are 0) and the row log-sum-exp L [..., Nq]
        (+inf for such rows).

    Raises:
        TypeError, ValueError: bad inputs, naming the argument.
    """
    _check_inputs(Q, K, V, causal, sm_scale, alignment)
    sm_scale = 1.0 / np.sqrt(Q.shape[-1]) if sm_scale is None else sm_scale
    S = sm_scale * Q @ np.swapaxes(K, -1, -2)  # S = σ Q Kᵀ            [..., Nq, Nk]
    if causal:
        S = np.where(causal_mask(Q.shape[-2], K.shape[-2], alignment), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)  # row max                [..., Nq, 1]
    m = np.where(np.isfinite(m), m, 0.0)  # an empty row has m = -inf: keep exp() away from NaN
    E = np.exp(S - m)  # e^(S - m)              [..., Nq, Nk]
    ell = E.sum(axis=-1, keepdims=True)  # row sum                [..., Nq, 1]
    P = E / np.where(ell > 0, ell, 1.0)  # P = softmax(S), rows of zeros where nothing is visible
    O = P @ V  # O = P V                [..., Nq, d]
    with np.errstate(divide="ignore"):
        L = np.where(ell > 0, m + np.log(ell), np.inf)[..., 0]  # L = logsumexp(S) [..., Nq]
    return O, L
# --8<-- [end:naive]


# --8<-- [start:forward]
def flash_attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, Br: int, Bc: int,
                            causal: bool = False, sm_scale: float | None = None,
                            trace: list | None = None,
                            alignment: str = "top_left") -> tuple[np.ndarray, np.ndarray]:
    """FlashAttention-2 forward (Dao 2023, Algorithm 1) for one head, in tiles of Br x Bc.

    Args:
        Q: [Nq, d] floats.
        K: [Nk, d] floats.
        V: [Nk, dv] floats.
        Br: query rows per tile, a positive int.
        Bc: keys per tile, a positive int.
        causal: as in ``attention_naive``.
        sm_scale: as in ``attention_naive``.
        trace: a list to which every inner step (i, j) is appended as a dict, or None.
        alignment: as in ``attention_naive``.

    Returns:
        (O, L) as ``attention_naive`` returns them.

    Raises:
        TypeError, ValueError: bad inputs, naming the argument.
    """
    _check_inputs(Q, K, V, causal, sm_scale, alignment, ndim=2)
    _check_tiles(Br, Bc)
    Nq, d = Q.shape
    Nk = K.shape[0]
    sm_scale = 1.0 / np.sqrt(d) if sm_scale is None else sm_scale
    O = np.zeros((Nq, V.shape[1]))
    L = np.zeros(Nq)
    for i in range(0, Nq, Br):  # one program of the kernel per query tile
        Qi = Q[i : i + Br]  # Q_i                    [Br, d]
        m = np.full(len(Qi), -np.inf)  # m_i^(0) = -inf         [Br]
        ell = np.zeros(len(Qi))  # ℓ_i^(0) = 0            [Br]
        Oi = np.zeros((len(Qi), V.shape[1]))  # Õ_i^(0) = 0            [Br, d]
        for j in range(0, Nk, Bc):
            Kj, Vj = K[j : j + Bc], V[j : j + Bc]  # K_j, V_j               [Bc, d]
            S = sm_scale * Qi @ Kj.T  # S_ij = σ Q_i K_jᵀ      [Br, Bc]
            if causal:
                visible = causal_mask(Nq, Nk, alignment)[i : i + Br, j : j + Bc]
                if not visible.any():
                    continue  # a tile wholly in the future is skipped, not computed
                S = np.where(visible, S, -np.inf)
            m_new = np.maximum(m, S.max(axis=1))  # m_i^(j) = max(m_i^(j-1), rowmax S_ij)
            m_safe = np.where(m_new == -np.inf, 0.0, m_new)  # rows with nothing seen yet
            P = np.exp(S - m_safe[:, None])  # P̃_ij = e^(S_ij - m_i^(j))       [Br, Bc]
            alpha = np.exp(m - m_safe)  # e^(m_i^(j-1) - m_i^(j)); m starts at -inf, so 0 at first
            ell = alpha * ell + P.sum(axis=1)  # ℓ_i^(j) = α ℓ_i^(j-1) + rowsum P̃_ij
            Oi = alpha[:, None] * Oi + P @ Vj  # Õ_i^(j) = diag(α) Õ_i^(j-1) + P̃_ij V_j
            m = m_new
            if trace is not None:
                trace.append(dict(i=i // Br, j=j // Bc, S=S, m=m.copy(), P=P, alpha=alpha,
                                  ell=ell.copy(), O_tilde=Oi.copy()))
        O[i : i + Br] = Oi / np.where(ell > 0, ell, 1.0)[:, None]  # O_i = diag(ℓ_i)⁻¹ Õ_i
        with np.errstate(divide="ignore"):
            L[i : i + Br] = np.where(ell > 0, m + np.log(ell), np.inf)  # L_i = m_i + log ℓ_i
    return O, L
# --8<-- [end:forward]


# --8<-- [start:backward]
def flash_attention_backward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, O: np.ndarray,
                             dO: np.ndarray, L: np.ndarray, causal: bool = False,
                             sm_scale: float | None = None, alignment: str = "top_left"
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dQ, dK, dV) by recomputing P from the saved L (Dao 2023, Algorithm 2).

    Written untiled for clarity: the kernel computes the same lines tile by tile.

    Args:
        Q: [Nq, d], as given to the forward.
        K: [Nk, d], as given to the forward.
        V: [Nk, dv], as given to the forward.
        O: [Nq, dv], as the forward returned it.
        dO: [Nq, dv], the gradient of O.
        L: [Nq], the log-sum-exp the forward returned.
        causal: as given to the forward.
        sm_scale: as given to the forward.
        alignment: as given to the forward.

    Returns:
        dQ [Nq, d], dK [Nk, d], dV [Nk, dv].

    Raises:
        TypeError, ValueError: bad inputs, naming the argument.
    """
    _check_inputs(Q, K, V, causal, sm_scale, alignment, ndim=2)
    _check_saved(Q, V, O, dO, L)
    sm_scale = 1.0 / np.sqrt(Q.shape[-1]) if sm_scale is None else sm_scale
    S = sm_scale * Q @ K.T  # S = σ Q Kᵀ              [Nq, Nk]
    if causal:
        S = np.where(causal_mask(Q.shape[0], K.shape[0], alignment), S, -np.inf)
    P = np.exp(S - L[:, None])  # P = e^(S - L): recomputed, never stored; L = +inf gives 0
    Dlt = (dO * O).sum(axis=1)  # D_i = rowsum(dO ∘ O) = rowsum(dP ∘ P)         [Nq]
    dV = P.T @ dO  # dV = Pᵀ dO                                     [Nk, d]
    dP = dO @ V.T  # dP = dO Vᵀ                                     [Nq, Nk]
    dS = P * (dP - Dlt[:, None])  # dS_ij = P_ij (dP_ij - D_i)      [Nq, Nk]
    dQ = sm_scale * dS @ K  # dQ = σ dS K                                 [Nq, d]
    dK = sm_scale * dS.T @ Q  # dK = σ dSᵀ Q                                [Nk, d]
    return dQ, dK, dV
# --8<-- [end:backward]


# --8<-- [start:memory]
def tile_bytes(Br: int, Bc: int, d: int, itemsize: int = 2) -> int:
    """On-chip bytes of one inner step: Q_i, K_j, V_j tiles in the input dtype, plus
    the fp32 S_ij/P̃_ij tile, the fp32 accumulator Õ_i and the fp32 statistics m_i, ℓ_i."""
    inputs = (Br * d + 2 * Bc * d) * itemsize  # Q_i, K_j, V_j
    fp32 = (Br * Bc + Br * d + 2 * Br) * 4  # S_ij, Õ_i, m_i, ℓ_i
    return inputs + fp32


def hbm_bytes_standard(N: int, d: int, itemsize: int = 2) -> int:
    """HBM traffic of three-pass standard attention (S and P written and read back)."""
    return itemsize * (2 * N * d  # read Q, K; write S
                       + N * N
                       + 2 * N * N  # read S, write P
                       + N * N + N * d  # read P, V
                       + N * d)  # write O


def hbm_bytes_flash(N: int, d: int, Br: int, itemsize: int = 2) -> int:
    """HBM traffic of the FA2 forward: Q read and O written once, K and V read once per query
    tile (T_r = ceil(N / B_r) times), plus the fp32 log-sum-exp."""
    Tr = -(-N // Br)
    return itemsize * (2 * N * d + 2 * N * d * Tr) + 4 * N


def largest_tile(M: int, d: int, itemsize: int = 2) -> int:
    """The largest power-of-two B_r = B_c whose inner step fits in M bytes of on-chip memory."""
    B = 16
    while tile_bytes(2 * B, 2 * B, d, itemsize) <= M:
        B *= 2
    return B
# --8<-- [end:memory]
