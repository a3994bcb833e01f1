r"""Unconstrained parametrisations of phase-type distributions: every real parameter vector gives a valid PH, so
gradient descent needs no clipping.

- *Coxian* of order $m$ (`{"rates": u, "cont": v}`): rates $\mu_i = \mathrm{softplus}(u_i) + \epsilon$, continuation
  probabilities $p_i = \sigma(v_i)$, $\alpha = e_1$. Every acyclic PH of order $m$ has such a representation (its
  canonical Coxian form), so this covers the acyclic PH(m), and every PH(2).
- *General* of order $m$ (`{"alpha": a, "off": b, "exit": e}`): $\alpha = \mathrm{softmax}(a)$, off-diagonal rates
  $T_{ij} = \mathrm{softplus}(b_{ij})$, exit rates $t_i = \mathrm{softplus}(e_i) + \epsilon$ and
  $T_{ii} = -\sum_{j\ne i} T_{ij} - t_i$: every phase can leave the chain, so absorption is reachable from each.

$\epsilon$ = `RATE_FLOOR` keeps rates positive where softplus underflows (in the units the fit works in, where the
target's mean is 1).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


STRUCTURES = ("coxian", "general")
RATE_FLOOR = 1e-12


def _softplus_inverse(y):
    y = np.asarray(y, dtype=float)
    return np.where(y > 30.0, y, np.log(np.expm1(np.maximum(y, 1e-300))))


def structure_of(params: dict) -> str:
    """The structure a parameter dict describes (by its keys)."""
    return "coxian" if "cont" in params else "general"


def ph_arrays(params: dict) -> tuple[Float[Array, " m"], Float[Array, "m m"]]:
    """`(alpha, T)` of the PH that the unconstrained `params` describe (traceable)."""
    if "cont" in params:
        rates = jax.nn.softplus(params["rates"]) + RATE_FLOOR
        p = jax.nn.sigmoid(params["cont"])
        m = rates.shape[0]
        T = -jnp.diag(rates) + jnp.diag(rates[:-1] * p, k=1)
        return jnp.zeros(m).at[0].set(1.0), T
    alpha = jax.nn.softmax(params["alpha"])
    m = alpha.shape[0]
    off = jax.nn.softplus(params["off"])  # (m, m - 1): row i, the other phases in order
    exits = jax.nn.softplus(params["exit"]) + RATE_FLOOR
    cols = np.array([[j for j in range(m) if j != i] for i in range(m)], dtype=int).reshape(m, m - 1)
    T = jnp.zeros((m, m)).at[np.repeat(np.arange(m), m - 1), cols.ravel()].set(off.ravel())
    T = T - jnp.diag(jnp.sum(off, axis=1) + exits)
    return alpha, T


def random_params(structure: str, order: int, rng: np.random.Generator, scale: float = 1.0) -> dict:
    """Unconstrained parameters of a random PH of order `order` whose phase rates are about `order / scale`."""
    m = order
    if structure == "coxian":
        rates = (m / scale) * np.exp(rng.normal(0.0, 1.0, m))
        return {"rates": jnp.asarray(_softplus_inverse(rates)), "cont": jnp.asarray(rng.normal(0.5, 1.5, m - 1))}
    exits = (1.0 / scale) * np.exp(rng.normal(0.0, 1.0, m))
    off = (m / scale) * np.exp(rng.normal(-1.0, 1.0, (m, m - 1)))
    return {"alpha": jnp.asarray(rng.normal(0.0, 1.0, m)), "off": jnp.asarray(_softplus_inverse(off)),
            "exit": jnp.asarray(_softplus_inverse(exits))}


def erlang_like_params(structure: str, order: int, scale: float = 1.0) -> dict:
    """Unconstrained parameters near an Erlang of order `order` and mean `scale` (continuations likely)."""
    m = order
    r = m / scale
    if structure == "coxian":
        return {"rates": jnp.asarray(_softplus_inverse(np.full(m, r))), "cont": jnp.full(m - 1, 3.0)}
    off = np.full((m, m - 1), 1e-3 * r)
    off[np.arange(m - 1), np.arange(m - 1)] = r  # i -> i + 1 sits at column i of row i
    exits = np.full(m, 1e-3 * r)
    exits[-1] = r
    return {"alpha": jnp.asarray(np.r_[3.0, np.zeros(m - 1)]), "off": jnp.asarray(_softplus_inverse(off)),
            "exit": jnp.asarray(_softplus_inverse(exits))}


def hyper_like_params(structure: str, order: int, scale: float = 1.0) -> dict:
    """Unconstrained parameters near a mixture of exponentials of mean `scale` whose means spread over two decades
    (for targets with a heavy tail)."""
    m = order
    rates = np.geomspace(4.0, 0.25, m) / scale
    if structure == "coxian":
        return {"rates": jnp.asarray(_softplus_inverse(np.sort(rates)[::-1].copy())),
                "cont": jnp.full(m - 1, 0.0)}
    off = np.full((m, m - 1), 1e-3 / scale)
    return {"alpha": jnp.zeros(m), "off": jnp.asarray(_softplus_inverse(off)),
            "exit": jnp.asarray(_softplus_inverse(rates))}
