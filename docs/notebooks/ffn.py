# %% [markdown]
# # A feed-forward network, trained by hand-written backprop
#
# Change the data, the widths, the activation, the learning rate and the number of steps in the
# first cell, then re-run. The forward pass, the manual backward pass and the gradient check are
# the NumPy reference of the [feed-forward](../posts/05-feed-forward-networks.md) and
# [backprop](../posts/06-backprop.md) posts: `kernelnotes.ffn.reference`.

# %%
import matplotlib.pyplot as plt
import numpy as np

from kernelnotes.ffn.reference import ffn_backward, ffn_forward, grad_check, mse_loss, train

# the problem: edit these
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, (128, 1))  # [B, d_0]
Y = np.sin(3 * X) + 0.3 * X**2  # [B, d_L]
widths = [1, 16, 16, 1]  # d_0, d_1, ..., d_L
act, lr, steps = "tanh", 0.1, 3000

# %% [markdown]
# ## Check the backward pass first
# Central differences of the loss against the manual gradients, on the initial weights.

# %%
init, _ = train(X, Y, widths, act=act, lr=lr, steps=0, seed=1)
y_hat, cache = ffn_forward(X, init, act)
grads, _ = ffn_backward(mse_loss(y_hat, Y)[1], init, cache, act)
params = [p for layer in init for p in layer]
numeric = grad_check(lambda: mse_loss(ffn_forward(X, init, act)[0], Y)[0], params)
worst = max(
    np.abs(g - n).max() / (np.abs(n).max() + 1e-300)
    for g, n in zip([g for pair in grads for g in pair], numeric, strict=True)
)
print(f"largest relative difference, backprop vs central differences: {worst:.2e}")

# %% [markdown]
# ## Train with full-batch gradient descent

# %%
layers, losses = train(X, Y, widths, act=act, lr=lr, steps=steps, seed=1)
print(f"loss {losses[0]:.4f} -> {losses[-1]:.2e} after {steps} steps")

xs = np.linspace(-1, 1, 400)[:, None]
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.5), constrained_layout=True)
ax0.semilogy(losses)
ax0.set_xlabel("step")
ax0.set_title("training loss")
ax1.scatter(X[:, 0], Y[:, 0], s=8, color="0.5", label="data")
ax1.plot(xs[:, 0], ffn_forward(xs, layers, act)[0][:, 0], label="network")
ax1.legend()
ax1.set_title(f"widths {widths}, {act}")
plt.show()
