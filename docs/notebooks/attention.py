# %% [markdown]
# # FlashAttention-2, interactively
#
# Change the sizes, tile shapes and the logit scale in the first cell and re-run. Everything here
# is the NumPy reference from the [FlashAttention-2 post](../posts/09-flash-attention-2.md):
# `attention_naive`, the tiled `flash_attention_forward` (the same loops as the Triton kernel)
# and `flash_attention_backward`.

# %%
import matplotlib.pyplot as plt
import numpy as np

from kernelnotes.attention import (
    attention_naive,
    flash_attention_backward,
    flash_attention_forward,
)

# the problem: edit these
Nq, Nk, d = 48, 64, 16
Br, Bc = 16, 8
logit_scale = 4.0  # larger -> peakier softmax, more rescaling of the running sums
causal = True
alignment = "top_left"  # as torch's is_causal; "bottom_right": the last query sees every key
rng = np.random.default_rng(0)
Q = logit_scale * rng.standard_normal((Nq, d))
K = rng.standard_normal((Nk, d))
V = rng.standard_normal((Nk, d))

# %% [markdown]
# ## Tiled = standard, for any tile shape
# The online softmax re-bases the running sums whenever the row maximum grows, so the result does
# not depend on $B_r$, $B_c$ (up to rounding).

# %%
O_ref, L_ref = attention_naive(Q, K, V, causal, alignment=alignment)
for br, bc in [(1, 1), (Br, Bc), (Nq, Nk)]:
    O, L = flash_attention_forward(Q, K, V, br, bc, causal, alignment=alignment)
    print(f"B_r={br:3d} B_c={bc:3d}: max |O - O_ref| = {np.abs(O - O_ref).max():.2e}, "
          f"max |L - L_ref| = {np.abs(L - L_ref).max():.2e}")

# %% [markdown]
# ## The running statistics of one query row
# The trace records $m$, $\ell$ after every inner step. The running max only grows; each time it
# does, $\ell$ is multiplied by $\alpha = e^{m^{\text{old}} - m^{\text{new}}} < 1$ before the new
# tile's sum is added.

# %%
trace = []
flash_attention_forward(Q, K, V, Br, Bc, causal, trace=trace, alignment=alignment)
row = Br - 1  # the last row of the first query tile
steps = [t for t in trace if t["i"] == 0]
fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
ax[0].step(range(1, len(steps) + 1), [t["m"][row] for t in steps], where="post")
ax[0].axhline(L_ref[row], ls=":", c="gray", label="final L (log-sum-exp)")
ax[0].set(xlabel="inner step j", ylabel="running max m", title="m only grows")
ax[0].legend()
ax[1].plot(range(1, len(steps) + 1), [t["ell"][row] for t in steps], "o-")
ax[1].set(xlabel="inner step j", ylabel="running sum ℓ", title="ℓ, re-based at every new max")
plt.tight_layout()

# %% [markdown]
# ## Backward by recomputation, against central differences

# %%
dO = rng.standard_normal((Nq, d))
dQ, dK, dV = flash_attention_backward(Q, K, V, O_ref, dO, L_ref, causal, alignment=alignment)
h = 1e-6
for name, X, G in (("Q", Q, dQ), ("K", K, dK), ("V", V, dV)):
    idx = tuple(rng.integers(0, s) for s in X.shape)
    E = np.zeros_like(X)
    E[idx] = h
    def loss(delta, name=name):
        Qx, Kx, Vx = (A + delta if n == name else A for n, A in zip("QKV", (Q, K, V), strict=True))
        return (attention_naive(Qx, Kx, Vx, causal, alignment=alignment)[0] * dO).sum()
    numeric = (loss(E) - loss(-E)) / (2 * h)
    print(f"d{name}{[int(i) for i in idx]}: recomputation {G[idx]: .8f}, "
          f"central difference {numeric: .8f}")
