"""Feed-forward networks and backprop in NumPy: the reference the Triton kernels are tested against.

Row convention, as the kernels and ``nn.Linear``: a batch X [B, d_0] goes through
``Z_l = A_{l-1} W_l^T + b_l``, ``A_l = sigma(Z_l)`` with W_l [d_l, d_{l-1}]; the last layer has no
activation. Imports without torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable

# --8<-- [start:activations]
_erfc = np.vectorize(math.erfc, otypes=[np.float64])  # NumPy has no erfc; clarity over speed
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
GELU_C = math.sqrt(2.0 / math.pi)  # the tanh form: u = sqrt(2/pi) (z + 0.044715 z^3)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))  # = 1 / (1 + e^-z), no overflow, accurate for z << 0


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """Phi(z) = erfc(-z / sqrt 2) / 2: erfc keeps its relative accuracy where 1 + erf(z / sqrt 2)
    cancels (z << 0: in float64 it is a multiple of 2^-53, and 0 from about z = -8.4)."""
    return 0.5 * _erfc(-z / math.sqrt(2.0))


def activation(z: np.ndarray, name: str) -> np.ndarray:
    """sigma(z), elementwise, for name in ACTIVATIONS (a ValueError naming it otherwise)."""
    if name == "none":
        return z
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "gelu":
        return z * normal_cdf(z)
    if name == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(GELU_C * (z + 0.044715 * z**3)))
    if name == "silu":
        return z * sigmoid(z)
    if name == "sigmoid":
        return sigmoid(z)
    if name == "tanh":
        return np.tanh(z)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


def activation_grad(z: np.ndarray, name: str) -> np.ndarray:
    """sigma'(z), elementwise (relu'(0) = 0, as PyTorch)."""
    if name == "none":
        return np.ones_like(z)
    if name == "relu":
        return (z > 0).astype(np.result_type(z, np.float32))
    if name == "gelu":
        pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)  # phi(z)
        return normal_cdf(z) + z * pdf  # Phi(z) + z phi(z)
    if name == "gelu_tanh":
        t = np.tanh(GELU_C * (z + 0.044715 * z**3))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t**2) * GELU_C * (1.0 + 3 * 0.044715 * z**2)
    if name == "silu":
        s = sigmoid(z)
        return s * (1.0 + z * (1.0 - s))
    if name == "sigmoid":
        s = sigmoid(z)
        return s * (1.0 - s)
    if name == "tanh":
        return 1.0 - np.tanh(z) ** 2
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


# --8<-- [end:activations]


# --8<-- [start:erfc_fit]
def erfc_fit(p: float = 0.375, degree: int = 6, s_max: float = 10.0
             ) -> tuple[np.ndarray, float]:
    """Coefficients c of erfc(s) ~ t P(t) e^(-s^2), t = 1 / (1 + p s), P(t) = sum_k c_k t^k, for
    s in [0, s_max], fitted for the smallest largest *relative* error (Lawson's reweighted least
    squares). Returns (c, that error). The GELU epilogue of the Triton kernels evaluates this."""
    s = np.concatenate([np.linspace(0.0, 1.0, 4001), np.linspace(1.0, s_max, 18001)[1:]])
    t = 1.0 / (1.0 + p * s)
    y = _erfc(s) * np.exp(s * s) / t  # the target P(t): erfc(s) e^(s^2) / t, smooth on (0, 1]
    A = np.vander(t, degree + 1, increasing=True)  # [t^0 ... t^degree]
    w = 1.0 / y  # weights for relative error
    for _ in range(60):  # weight up where the error is large: the max error goes down
        c = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)[0]
        r = np.abs(A @ c / y - 1.0)
        w = w * (1.0 + r / r.max())
    return c, r.max()
# --8<-- [end:erfc_fit]


# --8<-- [start:forward]
def ffn_forward(X: np.ndarray, layers: list, act: str = "relu"
                ) -> tuple[np.ndarray, list]:
    """L-layer FFN. layers = [(W_1, b_1), ..., (W_L, b_L)], W_l [d_l, d_{l-1}], b_l [d_l]."""
    A = X  # A_0 = X                                              [B, d_0]
    cache = [(A, None)]
    for ell, (W, b) in enumerate(layers, start=1):
        Z = A @ W.T + b  # Z_l = A_{l-1} W_l^T + b_l                [B, d_l]
        A = activation(Z, act) if ell < len(layers) else Z  # A_l = sigma(Z_l), none on the output
        cache.append((A, Z))
    return A, cache  # y_hat = A_L                                  [B, d_L]


# --8<-- [end:forward]


# --8<-- [start:backward]
def ffn_backward(dY: np.ndarray, layers: list, cache: list, act: str = "relu"
                 ) -> tuple[list, np.ndarray]:
    """Gradients of a scalar loss L given dY = dL/dy_hat [B, d_L]: [(dW_l, db_l)], dL/dX."""
    grads = []
    dZ = dY  # the output layer has no activation: dL/dZ_L = dL/dy_hat  [B, d_L]
    for ell in range(len(layers), 0, -1):
        W, _ = layers[ell - 1]
        A_prev, Z_prev = cache[ell - 1]
        dW = dZ.T @ A_prev  # dL/dW_l = dZ_l^T A_{l-1}                     [d_l, d_{l-1}]
        db = dZ.sum(axis=0)  # dL/db_l = sum over the batch of dZ_l        [d_l]
        dA = dZ @ W  # dL/dA_{l-1} = dZ_l W_l                              [B, d_{l-1}]
        grads.append((dW, db))
        if ell > 1:
            dZ = dA * activation_grad(Z_prev, act)  # dZ_{l-1} = dA_{l-1} * sigma'(Z_{l-1})
    return grads[::-1], dA  # dA is now dL/dX                             [B, d_0]


# --8<-- [end:backward]


# --8<-- [start:loss]
def mse_loss(Y_hat: np.ndarray, Y: np.ndarray) -> tuple[float, np.ndarray]:
    """L = 1/(2B) sum ||y_hat - y||^2 and its gradient dL/dY_hat = (Y_hat - Y) / B."""
    B = Y.shape[0]
    R = Y_hat - Y  # residuals                                        [B, d_L]
    return 0.5 * float(np.sum(R * R)) / B, R / B


# --8<-- [end:loss]


# --8<-- [start:grad_check]
def grad_check(loss_fn: Callable[[], float], params: list, eps: float = 1e-6
               ) -> list:
    """Central differences (L(p + eps e_i) - L(p - eps e_i)) / (2 eps), for every entry of every
    float64 array in params (changed in place and restored); error O(eps^2) + O(u / eps)."""
    numeric = []
    for P in params:
        G = np.zeros_like(P)
        for i in np.ndindex(P.shape):
            old = P[i]
            P[i] = old + eps
            up = loss_fn()
            P[i] = old - eps
            down = loss_fn()
            P[i] = old
            G[i] = (up - down) / (2.0 * eps)
        numeric.append(G)
    return numeric


# --8<-- [end:grad_check]


# --8<-- [start:xor]
XOR_X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])  # [4, 2]
XOR_Y = np.array([[0.0], [1.0], [1.0], [0.0]])  # [4, 1]


def xor_layers() -> list:
    """A hand-made ReLU network for XOR: h_1 = relu(x_1 + x_2), h_2 = relu(x_1 + x_2 - 1),
    y = h_1 - 2 h_2."""
    W1 = np.array([[1.0, 1.0], [1.0, 1.0]])  # [2, 2]
    b1 = np.array([0.0, -1.0])  # [2]
    W2 = np.array([[1.0, -2.0]])  # [1, 2]
    b2 = np.array([0.0])  # [1]
    return [(W1, b1), (W2, b2)]


# --8<-- [end:xor]


# --8<-- [start:train]
def train(X: np.ndarray, Y: np.ndarray, widths: list, act: str = "tanh", lr: float = 0.5,
          steps: int = 2000, seed: int = 0) -> tuple[list, np.ndarray]:
    """Full-batch gradient descent on the MSE loss: W <- W - lr dL/dW (the GD post's update)."""
    rng = np.random.default_rng(seed)
    layers = []
    for d_in, d_out in zip(widths[:-1], widths[1:], strict=True):
        bound = 1.0 / math.sqrt(d_in)  # nn.Linear's initialization
        W, b = rng.uniform(-bound, bound, (d_out, d_in)), rng.uniform(-bound, bound, d_out)
        layers.append((W, b))
    losses = []
    for _ in range(steps):
        Y_hat, cache = ffn_forward(X, layers, act)
        loss, dY = mse_loss(Y_hat, Y)
        grads, _ = ffn_backward(dY, layers, cache, act)
        layers = [
            (W - lr * dW, b - lr * db) for (W, b), (dW, db) in zip(layers, grads, strict=True)
        ]
        losses.append(loss)
    return layers, np.array(losses)


# --8<-- [end:train]


# --8<-- [start:hat_fit]
def relu_fit(f: Callable[[np.ndarray], np.ndarray], h: int, lo: float = 0.0, hi: float = 1.0,
             n_fit: int = 2048) -> list:
    """A width-h ReLU network for f on [lo, hi]: hidden unit i is relu(x - k_i) with knots k_i
    spread over [lo, hi), and the output weights solve the least-squares problem on n_fit points.
    Returns the network as layers (W_1 [h, 1], b_1, W_2 [1, h], b_2)."""
    knots = lo + (hi - lo) * np.arange(h) / h  # k_0 = lo, so unit 0 is the line x - lo
    W1, b1 = np.ones((h, 1)), -knots  # z_i = x - k_i                     [h, 1], [h]
    x = np.linspace(lo, hi, n_fit)[:, None]  # [n_fit, 1]
    A = np.maximum(x @ W1.T + b1, 0.0)  # hidden activations             [n_fit, h]
    A1 = np.hstack([A, np.ones_like(x)])  # the last column fits b_2       [n_fit, h + 1]
    coef = np.linalg.lstsq(A1, f(x[:, 0]), rcond=None)[0]  # [h + 1]
    return [(W1, b1), (coef[None, :h], coef[h:])]


# --8<-- [end:hat_fit]


# --8<-- [start:swiglu]
def swiglu_ffn_forward(X: np.ndarray, W_gate: np.ndarray, W_up: np.ndarray,
                       W_down: np.ndarray) -> np.ndarray:
    """The gated transformer FFN (SwiGLU): (silu(X W_gate^T) * (X W_up^T)) W_down^T."""
    G = X @ W_gate.T  # [B, h]
    U = X @ W_up.T  # [B, h]
    return (activation(G, "silu") * U) @ W_down.T  # [B, d]


# --8<-- [end:swiglu]


# --8<-- [start:counts]
def param_count(widths: list, bias: bool = True) -> int:
    """sum_l (d_l d_{l-1} + d_l) for widths = [d_0, d_1, ..., d_L]."""
    pairs = zip(widths[:-1], widths[1:], strict=True)
    return sum(d_out * d_in + (d_out if bias else 0) for d_in, d_out in pairs)


def matmul_flops(B: int, widths: list, input_grad: bool = False) -> tuple[int, int]:
    """Multiply-add FLOPs (2 per multiply-add) of the forward and backward matmuls of an FFN:
    forward Z_l = A W^T (2 B d_l d_{l-1}); backward dW_l = dZ^T A and dA_{l-1} = dZ W,
    the last skipped for the first layer unless the input needs a gradient."""
    fwd = sum(2 * B * d_out * d_in for d_in, d_out in zip(widths[:-1], widths[1:], strict=True))
    bwd = 2 * fwd - (0 if input_grad else 2 * B * widths[0] * widths[1])
    return fwd, bwd


# --8<-- [end:counts]


# --8<-- [start:worked]
def worked_example() -> tuple[np.ndarray, np.ndarray, list]:
    """The backprop post's numbers: x [1, 2], a 2-3-1 ReLU network, target y = 1."""
    X = np.array([[1.0, 2.0]])  # [1, 2]
    Y = np.array([[1.0]])  # [1, 1]
    W1 = np.array([[0.5, -0.25], [-1.0, 0.25], [0.25, 0.75]])  # [3, 2]
    b1 = np.array([0.1, 0.2, -0.3])  # [3]
    W2 = np.array([[1.0, -0.5, 0.5]])  # [1, 3]
    b2 = np.array([0.2])  # [1]
    return X, Y, [(W1, b1), (W2, b2)]


# --8<-- [end:worked]
