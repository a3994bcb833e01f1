r"""`SimTables` of the JSQ families, written directly from their parameters.

The generic engine runs any family from its tables; these builders give the tables of JSQ(d) with PH service
(`jsq_tables`, used by `simulate(..., engine="generic")` for `jsmkt.JSQd` and `jsmkt.JSQdPH` whose models give no
tables, or with a `service` override) and of JSQ(d) with batch arrivals (`batch_jsq_tables`, `BatchJSQ`). They
are written from the physics, apart from the models' descriptions, so they also check the tables that the models
derive.

Cells of `jsq_tables` follow the fast PH engine's layout, `k * m + i` for `k` jobs and the phase `i` of the job in
service (phase 0 when idle; the cells `(0, i > 0)` are never occupied), so that both engines' `cell_fractions`
line up.
"""

import numpy as np

from .._distributions.ph import reachable_phases
from .tables import OVERFLOW, SimTables


def _prune(prob: np.ndarray, *others: np.ndarray):
    """Drop the entries (last axis) whose probability is 0 in every row, keeping at least one."""
    keep = prob.reshape(-1, prob.shape[-1]).any(axis=0)
    keep[0] |= not keep.any()
    return (prob[..., keep],) + tuple(o[..., keep] for o in others)


def jsq_tables(lam: float, weights, alpha, T, top: int) -> SimTables:
    r"""JSQ(D) with Poisson arrivals of rate `lam` per server, `P(D = j) = weights[j - 1]`, FCFS servers with
    $\mathrm{PH}(\alpha, T)$ service, at most `top` jobs per server.

    Clock (rate $u = \max_i -T_{ii}$ over the phases a job can visit): in phase $i$ a move to phase $j$ with
    probability $T_{ij}/u$, a completion with the next job starting in phase $j$ with probability
    $T^0_i \alpha_j / u$ (the server emptying after its last job). Arrivals: the key is the queue length; a job
    joining an empty server starts in phase $j$ with probability $\alpha_j$, one joining a busy server leaves its
    phase as it is; a server holding `top` jobs refuses it (`OVERFLOW`)."""
    alpha, T = np.asarray(alpha, float), np.asarray(T, float)
    weights = np.asarray(weights, float)
    m = alpha.size
    K = int(top)
    C = (K + 1) * m
    k = np.repeat(np.arange(K + 1), m)
    ph = np.tile(np.arange(m), K + 1)
    status = np.where(k == 0, 0, 1 + ph)
    names = ("idle", "busy") if m == 1 else ("idle",) + tuple(f"phase {i + 1}" for i in range(m))
    reach = reachable_phases(alpha, T)
    u = float(np.max(-np.diagonal(T)[reach]))
    exit_rates = -T.sum(axis=1)
    cells = np.arange(C)

    # Clock actions: (m - 1) phase moves, then m completions (next phase j).
    A = 2 * m - 1
    act_prob = np.zeros((C, A))
    act_target = np.tile(cells[:, None], (1, A))
    busy = k > 0
    for c in cells[busy]:
        kc, i = k[c], ph[c]
        others = [j for j in range(m) if j != i]
        for a, j in enumerate(others):
            act_prob[c, a] = T[i, j] / u
            act_target[c, a] = kc * m + j
        for j in range(m):
            act_prob[c, m - 1 + j] = exit_rates[i] * alpha[j] / u
            act_target[c, m - 1 + j] = (kc - 1) * m + j if kc > 1 else 0
    act_prob, act_target = _prune(act_prob, act_target)
    act_target = np.where(act_prob > 0, act_target, cells[:, None])

    # Arrivals: effects of joining each cell.
    eff_prob = np.zeros((1, C, m))
    eff_target = np.tile(cells[None, :, None], (1, 1, m))
    for c in cells:
        if k[c] == 0:
            eff_prob[0, c] = alpha
            eff_target[0, c] = m + np.arange(m) if K >= 1 else OVERFLOW
        else:
            eff_prob[0, c, 0] = 1.0
            eff_target[0, c, 0] = (k[c] + 1) * m + ph[c] if k[c] < K else OVERFLOW
    eff_prob, eff_target = _prune(eff_prob, eff_target)
    return SimTables(
        level=k, status=status, status_names=names, jobs=k, empty_cell=0, fcfs=True, u=u,
        act_prob=act_prob, act_target=act_target, act_stream=np.full(act_prob.shape, -1),
        stream_rate=np.array([float(lam)]), choice=weights[None, :], key=k[None, :].copy(),
        eff_prob=eff_prob, eff_target=eff_target, arrivals=np.array([True]),
    )


def batch_jsq_tables(batch_rate: float, batch_sizes, weights, mu: float, top: int) -> SimTables:
    """JSQ(D) with Poisson batches of rate `batch_rate` per server, `P(batch of b jobs) = batch_sizes[b - 1]`,
    each batch joining the shortest sampled queue as a whole; exponential FCFS servers of rate `mu`; at most
    `top` jobs per server (a batch that would exceed it is refused)."""
    sizes = np.asarray(batch_sizes, float)
    K = int(top)
    k = np.arange(K + 1)
    b = np.arange(1, sizes.size + 1)
    to = k[:, None] + b[None, :]
    return SimTables(
        level=k, status=(k > 0).astype(int), status_names=("idle", "busy"), jobs=k, empty_cell=0, fcfs=True,
        u=float(mu), act_prob=(k > 0).astype(float)[:, None], act_target=np.maximum(k - 1, 0)[:, None],
        act_stream=np.full((K + 1, 1), -1), stream_rate=np.array([float(batch_rate)]),
        choice=np.asarray(weights, float)[None, :], key=k[None, :].copy(),
        eff_prob=np.tile(sizes, (K + 1, 1))[None], eff_target=np.where(to > K, OVERFLOW, to)[None],
        arrivals=np.array([True]),
    )


class BatchJSQ:
    """A stand-in model of JSQ(d) with batch arrivals for `jsmkt.simulate` (its tables from `batch_jsq_tables`):
    `batch_rate` per server, batch-size probabilities `batch_sizes` (sizes 1, 2, ...), choice number `d`
    (an integer), exponential service of rate `mu`."""

    def __init__(self, batch_rate: float, batch_sizes, d: int = 2, mu: float = 1.0):
        self.batch_rate, self.batch_sizes, self.d, self.mu = float(batch_rate), np.asarray(batch_sizes, float), d, mu
        self.weights = np.eye(d)[d - 1]

    def load(self) -> float:
        return self.batch_rate * float(np.arange(1, self.batch_sizes.size + 1) @ self.batch_sizes) / self.mu

    def simulation_tables(self, top: int) -> SimTables:
        return batch_jsq_tables(self.batch_rate, self.batch_sizes, self.weights, self.mu, top)

    def __repr__(self) -> str:
        return f"BatchJSQ(batch_rate={self.batch_rate}, batch_sizes={self.batch_sizes.tolist()}, d={self.d})"


class TablesModel:
    """A stand-in model whose `simulation_tables(top)` is `make(top)` and whose `load()` is `load`."""

    def __init__(self, make, load: float, name: str = "TablesModel"):
        self._make, self._load, self._name = make, float(load), name

    def load(self) -> float:
        return self._load

    def simulation_tables(self, top: int) -> SimTables:
        return self._make(top)

    def __repr__(self) -> str:
        return self._name

