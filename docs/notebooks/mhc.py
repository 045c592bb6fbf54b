# %% [markdown]
# # mHC, interactively
#
# Change the logit scale, the number of Sinkhorn iterations, eps and the depth in the first cell
# and re-run. Everything here is the float64 NumPy reference of the
# [mHC post](../posts/07-mhc-hyper-connections.md): `kernelnotes.mhc.reference`.

# %%
import matplotlib.pyplot as plt
import numpy as np

from kernelnotes.mhc.reference import amax_gain, mhc_layer, mhc_pre, sinkhorn

# the problem: edit these
logit_scale = 1.0  # spread of the comb logits; larger -> slower Sinkhorn convergence
iters = 20  # Sinkhorn iterations (DeepSeek-V4: 20)
eps = 1e-6  # Sinkhorn eps (DeepSeek-V4: 1e-6)
depth = 60  # layers in the stack below
d = 32  # embedding width of the toy stack
rng = np.random.default_rng(0)

# %% [markdown]
# ## One comb matrix
# `comb[j][k]` is what the kernels store; the layer's residual mapping is $B = \text{comb}^\top$.
# The last Sinkhorn step normalises the columns of comb (the rows of $B$), so those sums are 1
# up to eps; the other marginal is only approximately 1.

# %%
logits = logit_scale * rng.standard_normal((4, 4))
comb = sinkhorn(logits, iters, eps)
B = comb.T
np.set_printoptions(precision=4, suppress=True)
print("B =\n", B)
print("row sums of B:   ", B.sum(1))
print("column sums of B:", B.sum(0))
print("spectral norm of B:", np.linalg.norm(B, 2))

# %% [markdown]
# ## Marginal error against the iteration count

# %%
many = logit_scale * rng.standard_normal((256, 4, 4))
ts = np.arange(1, 3 * iters + 1)
err = [np.abs(sinkhorn(many, t, eps).sum(-1) - 1).max() for t in ts]
plt.semilogy(ts, err)
plt.axvline(iters, color="grey", lw=0.8)
plt.xlabel("iterations")
plt.ylabel("max |row sum of comb - 1|")
plt.title(f"256 random 4x4 matrices, logits ~ N(0, {logit_scale}^2), eps = {eps:g}")
plt.show()

# %% [markdown]
# ## A stack of mHC layers
# A toy stack: each layer has random `fn`, `scale`, `base` and a bounded sublayer
# $F = \tanh$; the streams start as copies of one embedding. Because every $B_l$ is (nearly)
# doubly stochastic and $C_l \le 2$, the residual grows at most additively with depth; the
# products of the $B_l$ never amplify.

# %%
X = np.tile(rng.standard_normal(d), (4, 1))
norms, P = [np.linalg.norm(X)], np.eye(4)
gains = []
for _ in range(depth):
    fn = rng.standard_normal((24, 4 * d)) / np.sqrt(4 * d)
    scale, base = logit_scale * np.ones(3), 0.3 * rng.standard_normal(24)
    _, _, c = mhc_pre(X, fn, scale, base, sinkhorn_iters=iters, sinkhorn_eps=eps)
    P = c.T @ P
    gains.append(amax_gain(P))
    X = mhc_layer(X, np.tanh, fn, scale, base, sinkhorn_iters=iters, sinkhorn_eps=eps)
    norms.append(np.linalg.norm(X))

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
a1.plot(norms)
a1.set_xlabel("layer")
a1.set_ylabel("||X_l||_F")
a2.plot(np.arange(1, depth + 1), gains)
a2.set_xlabel("layer")
a2.set_ylabel("Amax gain of B_l ... B_1")
plt.show()
print(f"largest Amax gain over {depth} layers: {max(gains):.6f}")
