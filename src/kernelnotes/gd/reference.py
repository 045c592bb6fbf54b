"""Gradient descent and its descendants, written the way the post writes them.

Every iterative method returns its whole history (``theta_0, theta_1, ...``), so the post can
print tables, count steps and plot paths from the same code. The single-step updates
(``sgd_update``, ``adam_update``) are the float64 references of the Triton kernels.
NumPy only: this module imports without torch.
"""

import math
from collections.abc import Callable

import numpy as np

# (no ``from __future__ import annotations``: the post runs these sections as written, so their
# annotations are evaluated and must exist there; "Grad" stays a string for that reason)
Grad = Callable[[np.ndarray], np.ndarray]  # theta [d] -> grad f(theta) [d]


# --8<-- [start:gd]
def gd(grad: "Grad", theta0: np.typing.ArrayLike, alpha: float, n_steps: int) -> np.ndarray:
    """Gradient descent theta_{k+1} = theta_k - alpha grad f(theta_k).

    Args:
        grad: the gradient, a function of theta [d] returning [d].
        theta0: the start, a number or [d].
        alpha: the learning rate.
        n_steps: the number of steps.

    Returns:
        Every iterate theta_0 .. theta_n, float64 [n_steps+1, d].
    """
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

    Args:
        x0: the start.
        alpha: the learning rate.
        tol: the tolerance on |x_k|, > 0.

    Returns:
        The first k with |x_k| <= tol (an int), or inf when |1 - 2 alpha| >= 1.
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
    """How GD on f(x) = x^2 behaves at rate alpha: the sign and size of 1 - 2 alpha decide it.

    Args:
        alpha: the learning rate (any real number).

    Returns:
        "monotone", "one step", "oscillating, convergent", "oscillating forever",
        "oscillating, divergent", "monotone, divergent" or "no progress".
    """
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
    """L(theta) = ||X theta - y||^2 / n, the mean squared error.

    Args:
        X: the data [n, d].
        y: the targets [n].
        theta: the coefficients [d].

    Returns:
        The loss, a float.
    """
    r = X @ theta - y  # residual                                           [n]
    return float(r @ r) / len(y)


def lstsq_grad(X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """grad L = (2/n) X^T (X theta - y): two matrix-vector products, 4nd flops.

    Args:
        X: the data [n, d].
        y: the targets [n].
        theta: the coefficients [d].

    Returns:
        The gradient of ``lstsq_loss`` [d].
    """
    return 2.0 / len(y) * (X.T @ (X @ theta - y))  # [d]
# --8<-- [end:least_squares]


# --8<-- [start:minibatch]
def minibatch_sgd(X: np.ndarray, y: np.ndarray, theta0: np.typing.ArrayLike, alpha: float,
                  batch: int, n_epochs: int, rng: np.random.Generator) -> np.ndarray:
    """Mini-batch SGD on the mean squared error; batch=1 is SGD, batch=n is batch GD.

    Each epoch visits the rows in a fresh random order, ``batch`` rows per step.

    Args:
        X: the data [n, d].
        y: the targets [n].
        theta0: the start [d].
        alpha: the learning rate.
        batch: rows per step, >= 1 (the last batch of an epoch may be smaller).
        n_epochs: passes over the data.
        rng: draws the order of the rows.

    Returns:
        The iterate after every step, [n_epochs * ceil(n / batch) + 1, d].
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
def momentum(grad: "Grad", theta0: np.typing.ArrayLike, alpha: float, beta: float,
             n_steps: int) -> np.ndarray:
    """Polyak's heavy ball; theta_{-1} = theta_0, so the first step is plain GD.

    Args:
        grad: the gradient, a function of theta [d] returning [d].
        theta0: the start, a number or [d].
        alpha: the learning rate.
        beta: the momentum, the share of the previous step added to this one.
        n_steps: the number of steps.

    Returns:
        Every iterate, float64 [n_steps+1, d].
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
def sgd_update(theta: np.ndarray, g: np.ndarray, buf: np.ndarray | None, *, lr: float,
               momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False, maximize: bool = False) -> tuple:
    """One step of torch.optim.SGD's rule in float64.

    With dampening 0, buf_k = beta buf_{k-1} + g_k and theta_{k+1} = theta_k - lr buf_k is the
    heavy ball above with beta = momentum.

    Args:
        theta: the parameters (any shape).
        g: their gradient, of theta's shape.
        buf: the momentum buffer, None on the first step.
        lr: the learning rate.
        momentum: the buffer's decay; 0 for plain SGD.
        dampening: the share of g left out of the buffer.
        weight_decay: an L2 penalty added to g.
        nesterov: step along g + momentum buf instead of buf.
        maximize: step up the gradient.

    Returns:
        (theta, buf) after the step.
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
def adam_update(theta: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, k: int, *,
                lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
                amsgrad: bool = False, vmax: np.ndarray | None = None,
                maximize: bool = False) -> tuple:
    """Step k (from 1) of Adam (Kingma & Ba 2015, Alg. 1) / AdamW (Loshchilov & Hutter 2019).

    eps is added to sqrt(v_hat), as torch.optim does.

    Args:
        theta: the parameters (any shape); g, m, v (and vmax) have its shape.
        g: the gradient.
        m: the first moment before this step (0 at the start).
        v: the second moment before this step (0 at the start).
        k: the step number, from 1 (the bias corrections divide by 1 - beta^k).
        lr: the learning rate.
        beta1: the decay of m.
        beta2: the decay of v.
        eps: added to sqrt(v_hat).
        weight_decay: L2 penalty in g, or AdamW's decay with ``decoupled_weight_decay``.
        decoupled_weight_decay: shrink theta by 1 - lr weight_decay instead.
        amsgrad: divide by the running maximum of v (``vmax``, required then).
        vmax: the running maximum of v before this step.
        maximize: step up the gradient.

    Returns:
        (theta, m, v, vmax) after the step.
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


def adam(grad: "Grad", theta0: np.typing.ArrayLike, n_steps: int, **hyper: float) -> np.ndarray:
    """Adam (or AdamW with decoupled_weight_decay=True) from theta0.

    Args:
        grad: the gradient, a function of theta [d] returning [d].
        theta0: the start, a number or [d].
        n_steps: the number of steps.
        **hyper: ``adam_update``'s keyword arguments (lr, beta1, beta2, eps, ...).

    Returns:
        Every iterate, float64 [n_steps+1, d].
    """
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
    """lr_k = lr0 gamma^floor(k / every).

    Args:
        k: the step, from 0.
        lr0: the first rate.
        gamma: the factor applied every ``every`` steps.
        every: steps between decays, >= 1.

    Returns:
        The rate at step k.
    """
    return lr0 * gamma ** (k // every)


def warmup_cosine(k: int, lr0: float, warmup: int, total: int, lr_min: float = 0.0) -> float:
    """Linear warmup to lr0 over ``warmup`` steps, then cosine annealing to lr_min at ``total``.

    Args:
        k: the step, from 0.
        lr0: the peak rate, reached at step ``warmup - 1``.
        warmup: warmup steps, >= 1.
        total: the step where the rate reaches ``lr_min``.
        lr_min: the final rate.

    Returns:
        The rate at step k.
    """
    if k < warmup:
        return lr0 * (k + 1) / warmup
    t = min(1.0, (k - warmup) / max(1, total - warmup))  # fraction of the decay done
    return lr_min + 0.5 * (lr0 - lr_min) * (1 + math.cos(math.pi * t))
# --8<-- [end:schedules]
