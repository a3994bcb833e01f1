"""The generic simulator's tables (`SimTables`) of a `Description`, and of any model `simulate` runs on them."""

import jax
import jax.numpy as jnp
import numpy as np

from .._distributions.bmap import stationary_vector
from .._models.base import AbstractDescribedModel
from .._models.description import INELIGIBLE, Cells, Description, Modulation, Moves, Pool
from .._models.meanfield import check_modulation, phase_generator, pool_cells
from .tables import INELIGIBLE as SIM_INELIGIBLE
from .tables import OVERFLOW, SimTables


def _concrete(name: str, x) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise ValueError(f"{name} is traced: simulation needs concrete parameters (call it outside jit/grad/vmap)")
    return np.asarray(x, dtype=float)


def _targets_or_overflow(cells: Cells, moves: Moves) -> np.ndarray:
    over = np.asarray(moves.level) > cells.K
    target = cells.index(np.minimum(moves.level, cells.K), moves.status)
    return np.where(over, OVERFLOW, target)


def _per_cell(C: int, source: np.ndarray, columns: list[np.ndarray], pads: list) -> list[np.ndarray]:
    """Rows grouped by source cell: each column as a `(C, width)` table padded with `pads`."""
    order = np.argsort(source, kind="stable")
    source = source[order]
    counts = np.bincount(source, minlength=C)
    width = max(int(counts.max()) if counts.size else 0, 1)
    slot = np.arange(source.size) - np.repeat(np.cumsum(counts) - counts, counts)
    out = []
    for col, pad in zip(columns, pads, strict=True):
        table = np.full((C, width), pad, dtype=np.asarray(col).dtype if np.ndim(pad) == 0 else float)
        table[source, slot] = np.asarray(col)[order]
        out.append(table)
    return out


def simulation_tables(desc: Description):
    """The generic simulator's `SimTables` of a description (concrete parameters): per cell its local events and
    the streams it starts, uniformised at the largest total rate of a cell; per stream its rate, choice law, keys
    and effects. Moves above the truncation are overflows. Servers hold FCFS queues where the description says
    `fcfs` and no stream starts at a server; their waiting jobs start in random order where it says `random_order`
    (and not `fcfs`)."""
    cells = desc.cells
    C = cells.size
    src, tgt, rate, stream = [], [], [], []
    for ev in desc.local_events:
        src.append(np.asarray(ev.moves.source))
        tgt.append(_targets_or_overflow(cells, ev.moves))
        rate.append(_concrete(f"the rates of {ev.name}", ev.moves.weight))
        stream.append(np.full(len(ev.moves.source), -1))
    for s, disp in enumerate(desc.dispatches):
        if disp.origin is not None:
            src.append(np.asarray(disp.origin.source))
            tgt.append(_targets_or_overflow(cells, disp.origin))
            rate.append(_concrete(f"the origin rates of {disp.name}", disp.origin.weight))
            stream.append(np.full(len(disp.origin.source), s))
    src = np.concatenate(src) if src else np.zeros(0, int)
    rate = np.concatenate(rate) if rate else np.zeros(0)
    total = np.bincount(src, weights=rate, minlength=C)
    u = float(total.max()) if total.size else 0.0
    prob = rate / u if u > 0 else rate * 0.0
    act_prob, act_target, act_stream = _per_cell(
        C, src, [prob, np.concatenate(tgt) if tgt else np.zeros(0, int), np.concatenate(stream) if stream else
                 np.zeros(0, int)], [0.0, 0, -1])
    # A padded action keeps the server where it is.
    act_target = np.where(act_prob > 0, act_target, np.arange(C)[:, None])
    S = len(desc.dispatches)
    max_d = max(d.choice.max_d for d in desc.dispatches) if S else 1
    choice = np.zeros((S, max_d))
    keys = np.full((S, C), SIM_INELIGIBLE, dtype=np.int64)
    effects = []
    for s, disp in enumerate(desc.dispatches):
        w = _concrete(f"the choice law of {disp.name}", disp.choice.weights())
        choice[s, : w.size] = w
        key = np.asarray(disp.key)
        keys[s] = np.where(key == INELIGIBLE, SIM_INELIGIBLE, key)
        eff = disp.effect
        effects.append(_per_cell(C, np.asarray(eff.source),
                                 [_concrete(f"the effect of {disp.name}", eff.weight), _targets_or_overflow(cells, eff)],
                                 [0.0, 0]))
    E = max((e[0].shape[1] for e in effects), default=1)
    eff_prob = np.zeros((S, C, E))
    eff_target = np.tile(np.arange(C)[None, :, None], (S, 1, E))
    for s, (p, t) in enumerate(effects):
        eff_prob[s, :, : p.shape[1]] = p
        eff_target[s, :, : t.shape[1]] = np.where(p > 0, t, np.arange(C)[:, None])
    origin = any(d.origin is not None for d in desc.dispatches)
    env = {}
    mod = check_modulation(desc)
    if isinstance(desc.environment, Pool):
        held, _, redirect, promote = pool_cells(cells, desc.environment)
        env = dict(pool_held=held, pool_redirect=redirect, pool_promote=promote,
                   pool_capacity=float(_concrete("the pool's capacity", desc.environment.capacity)))
    stream_rate = np.array([0.0 if d.rate is None else float(_concrete(f"the rate of {d.name}", d.rate))
                            for d in desc.dispatches])
    arrivals = np.array([d.arrivals for d in desc.dispatches], dtype=bool)
    if mod is not None:
        # Every stream gets its rates per phase move; the phase's silent moves are one more stream, which samples
        # one server and moves none (every cell ineligible). A stream runs at the largest of its phases' rates, the
        # engine thinning it in the others.
        if origin:
            raise ValueError("a modulating phase with streams that start at servers (origins) is not supported by "
                             "the simulator")
        m = mod.order
        rates = _concrete("the modulation's stream rates", mod.rates)
        silent = _concrete("the modulation's silent rates", mod.silent) * (1.0 - np.eye(m))
        phase_rates = stream_rate[:, None, None] * np.eye(m)[None]
        phase_rates[list(mod.streams)] = rates
        phase_rates = np.concatenate([phase_rates, silent[None]])
        stream_rate = phase_rates.sum(axis=2).max(axis=1)
        arrivals = np.concatenate([arrivals, [False]])
        choice = np.concatenate([choice, np.eye(1, choice.shape[1])])
        keys = np.concatenate([keys, np.full((1, C), SIM_INELIGIBLE, dtype=np.int64)])
        eff_prob = np.concatenate([eff_prob, np.zeros((1, C, E))])
        eff_target = np.concatenate([eff_target, np.tile(np.arange(C)[None, :, None], (1, 1, E))])
        init = np.asarray(stationary_vector(jnp.asarray(phase_generator(Modulation(mod.streams, rates, silent)))))
        env |= dict(phase_rates=phase_rates, phase_init=np.maximum(init, 0.0) / np.maximum(init, 0.0).sum())
    return SimTables(
        level=cells.level, status=cells.status, status_names=cells.status_names, jobs=cells.jobs, empty_cell=0,
        fcfs=bool(desc.fcfs and not origin), u=u, act_prob=act_prob, act_target=act_target, act_stream=act_stream,
        stream_rate=stream_rate, choice=choice, key=keys, eff_prob=eff_prob, eff_target=eff_target,
        arrivals=arrivals, random_order=bool(desc.random_order and not desc.fcfs), in_service=cells.in_service,
        **env,
    )


def has_tables(model) -> bool:
    """Whether the generic engine can run `model`: a family stated by its description, or a model with a method
    `simulation_tables(top)`."""
    return isinstance(model, AbstractDescribedModel) or hasattr(model, "simulation_tables")


def model_tables(model, top: int) -> SimTables:
    """The simulator's tables of `model` truncated at `top` jobs per server (concrete parameters only): those of
    its description at `K = top`, or, for a model given by tables, its `simulation_tables(top)`."""
    if isinstance(model, AbstractDescribedModel):
        return simulation_tables(model.with_K(top).description())
    return model.simulation_tables(top)

