"""Gradient descent and its descendants, written the way the post writes them.

Every iterative method returns its whole history (``theta_0, theta_1, ...``), so the post can
print tables, count steps and plot paths from the same code. The single-step updates
(``sgd_update``, ``adam_update``) are the float64 references of the Triton kernels.
NumPy only: this module imports without torch.
"""

from __future__ import annotations

import math

import numpy as np


# --8<-- [start:gd]
def gd(grad, theta0, alpha: float, n_steps: int) -> np.ndarray:
    """Gradient descent theta_{k+1} = theta_k - alpha grad f(theta_k); returns [n_steps+1, d]."""
    theta = np.atleast_1d(np.asarray(theta0, dtype=np.float64))  # [d]
    history = [theta]
    for _ in range(n_steps):
        theta = theta - alpha * grad(theta)  # step against the gradient        [d]
        history.append(theta)
    return np.array(history)  # [K+1, d]
# --8<-- [end:gd]


# --8<-- [start:quadratic]
def steps_to_tol(x0: float, alpha: float, tol: float) -> float:
    """Steps until |x_k| <= tol for f(x) = x^2, where x_k = (1 - 2 alpha)^k x_0 exactly.

    Returns inf when the iteration never gets there (|1 - 2 alpha| >= 1).
    """
    r = abs(1.0 - 2.0 * alpha)  # |x_{k+1}| = r |x_k|
    if abs(x0) <= tol:
        return 0
    if r == 0.0:
        return 1  # alpha = 1/2 lands on the minimum in one step
    if r >= 1.0:
        return math.inf
    return math.ceil(math.log(tol / abs(x0)) / math.log(r))  # smallest k with r^k |x0| <= tol


def regime(alpha: float) -> str:
    """How GD on f(x) = x^2 behaves at rate alpha: the sign and size of 1 - 2 alpha decide it."""
    r = 1.0 - 2.0 * alpha
    if r == 0.0:
        return "one step"  # alpha = 1/2
    if 0.0 < r < 1.0:
        return "monotone"  # 0 < alpha < 1/2
    if -1.0 < r < 0.0:
        return "oscillating, convergent"  # 1/2 < alpha < 1
    if r == -1.0:
        return "oscillating forever"  # alpha = 1: x_k = (-1)^k x_0
    if r == 1.0:
        return "no progress"  # alpha = 0
    return "oscillating, divergent" if r < -1.0 else "monotone, divergent"  # alpha > 1 or < 0
# --8<-- [end:quadratic]


# --8<-- [start:least_squares]
def lstsq_loss(X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> float:
    """L(theta) = ||X theta - y||^2 / n, the mean squared error."""
    r = X @ theta - y  # residual                                           [n]
    return float(r @ r) / len(y)


def lstsq_grad(X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """grad L = (2/n) X^T (X theta - y): two matrix-vector products, 4nd flops."""
    return 2.0 / len(y) * (X.T @ (X @ theta - y))  # [d]
# --8<-- [end:least_squares]


# --8<-- [start:minibatch]
def minibatch_sgd(X, y, theta0, alpha: float, batch: int, n_epochs: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Mini-batch SGD on the mean squared error; batch=1 is SGD, batch=n is batch GD.

    Each epoch visits the rows in a fresh random order, ``batch`` rows per step; returns the
    iterate after every step, [n_epochs * ceil(n / batch) + 1, d].
    """
    n = len(y)
    theta = np.asarray(theta0, dtype=np.float64)  # [d]
    history = [theta]
    for _ in range(n_epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch):
            B = order[start:start + batch]  # the mini-batch                    [b]
            g = lstsq_grad(X[B], y[B], theta)  # unbiased estimate of grad L      [d]
            theta = theta - alpha * g
            history.append(theta)
    return np.array(history)
# --8<-- [end:minibatch]


# --8<-- [start:momentum]
def momentum(grad, theta0, alpha: float, beta: float, n_steps: int) -> np.ndarray:
    """Polyak's heavy ball; theta_{-1} = theta_0, so the first step is plain GD.

    Returns [n_steps+1, d].
    """
    theta = np.atleast_1d(np.asarray(theta0, dtype=np.float64))  # [d]
    prev = theta
    history = [theta]
    for _ in range(n_steps):
        # theta_{k+1} = theta_k - alpha grad f(theta_k) + beta (theta_k - theta_{k-1})
        theta, prev = theta - alpha * grad(theta) + beta * (theta - prev), theta
        history.append(theta)
    return np.array(history)
# --8<-- [end:momentum]


# --8<-- [start:sgd_update]
def sgd_update(theta, g, buf, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
               nesterov=False, maximize=False):
    """One step of torch.optim.SGD's rule in float64; ``buf`` None on the first step.

    Returns (theta, buf). With dampening 0, buf_k = beta buf_{k-1} + g_k and
    theta_{k+1} = theta_k - lr buf_k is the heavy ball above with beta = momentum.
    """
    g = -g if maximize else g
    if weight_decay:  # an infinite theta would add inf * 0 = NaN
        g = g + weight_decay * theta  # L2 penalty
    if momentum != 0:
        buf = g if buf is None else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    return theta - lr * g, buf
# --8<-- [end:sgd_update]


# --8<-- [start:adam_update]
def adam_update(theta, g, m, v, k: int, *, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=0.0, decoupled_weight_decay=False, amsgrad=False, vmax=None,
                maximize=False):
    """Step k (from 1) of Adam (Kingma & Ba 2015, Alg. 1) / AdamW (Loshchilov & Hutter 2019).

    eps is added to sqrt(v_hat), as torch.optim does. Returns (theta, m, v, vmax).
    """
    g = -g if maximize else g
    if weight_decay and decoupled_weight_decay:
        theta = theta * (1 - lr * weight_decay)  # AdamW: shrink theta directly
    elif weight_decay:
        g = g + weight_decay * theta  # Adam: L2 penalty inside the moments
    m = beta1 * m + (1 - beta1) * g  # first moment
    v = beta2 * v + (1 - beta2) * g * g  # second moment
    m_hat = m / (1 - beta1**k)  # bias corrections: m, v start at 0
    if amsgrad:
        vmax = np.maximum(vmax, v)
        v_hat = vmax / (1 - beta2**k)
    else:
        v_hat = v / (1 - beta2**k)
    theta = theta - lr * m_hat / (np.sqrt(v_hat) + eps)
    return theta, m, v, vmax


def adam(grad, theta0, n_steps: int, **hyper) -> np.ndarray:
    """Adam (or AdamW with decoupled_weight_decay=True) from theta0; returns [n_steps+1, d]."""
    theta = np.atleast_1d(np.asarray(theta0, dtype=np.float64))
    m, v, vmax = np.zeros_like(theta), np.zeros_like(theta), np.zeros_like(theta)
    history = [theta]
    for k in range(1, n_steps + 1):
        theta, m, v, vmax = adam_update(theta, grad(theta), m, v, k, vmax=vmax, **hyper)
        history.append(theta)
    return np.array(history)
# --8<-- [end:adam_update]


# --8<-- [start:schedules]
def step_decay(k: int, lr0: float, gamma: float, every: int) -> float:
    """lr_k = lr0 gamma^floor(k / every)."""
    return lr0 * gamma ** (k // every)


def warmup_cosine(k: int, lr0: float, warmup: int, total: int, lr_min: float = 0.0) -> float:
    """Linear warmup to lr0 over ``warmup`` steps, then cosine annealing to lr_min at ``total``."""
    if k < warmup:
        return lr0 * (k + 1) / warmup
    t = min(1.0, (k - warmup) / max(1, total - warmup))  # fraction of the decay done
    return lr_min + 0.5 * (lr0 - lr_min) * (1 + math.cos(math.pi * t))
# --8<-- [end:schedules]
