r"""The mean field derived from a `Description`: transitions by the tail rule, the drift, the averaged
description of a modulating phase, a saturated pool, and the arrival streams' job flows the metrics read.

**The tail rule.** With the eligible keys ranked $\kappa_1 < \kappa_2 < \dots$ and $F_{\ge\kappa}$ the fraction
of servers whose key is $\ge \kappa$ or ineligible, the best of $D$ servers sampled with replacement has key
$\kappa$ with probability $g(F_{\ge\kappa}) - g(F_{>\kappa})$ ($g$ the pgf of $D$), and within that key the chosen
server's cell is in proportion to occupancy. So a server in cell $c$ of key $\kappa$ is chosen at rate
$R\,h(F_{\ge\kappa}, F_{>\kappa})$ per unit of the stream's rate $R$ per server, with the divided difference
$h(a, b) = (g(a) - g(b))/(a - b)$ (`AbstractChoice.join_factor`), which never divides by a vanishing difference.
A stream with an origin moves two servers at once; its transitions carry the chosen server as a `Partner`, so the
jump covariance of the refined mean field sees both moves. In the mean-field limit the origin is sampled with
probability $O(1/N)$ and the choice sees the occupancy before the origin's move, which is $O(1/N)$ away; the
refined mean field adds that $1/N$ drift (`jsmkt._refined_terms.origin_drift_correction`).

**A modulating phase in the mean field** (averaging). The phase $J$ is a Markov chain of generator $NG$, $G$ the
`Modulation`'s per-server rates; a modulated stream fires at rate $N r_s(J)$. The occupancy moves by $O(1/N)$
per event, so over the time the occupancy takes to change the phase makes $O(N)$ moves and its fraction of time
in phase $i$ tends to $\gamma_i$, the stationary law of $G$, whatever the occupancy: the limit is the
description with stream $s$ at the constant rate $\gamma r_s$ (`averaged`). The phase's correlations enter the
$O(1/N)$ terms (`jsmkt._refined_terms.modulation_noise`), not the limit.

**A saturated pool in the mean field.** Every unit is held and servers wait, so a move into the holding status
goes to the waiting status (same level), and a move out of it carries a partner: the uniformly chosen waiting
server, cell $w$ with probability $x_w/\sum_{w'} x_{w'}$, which moves to the holding status at its level. The
holding status then keeps its mass exactly. The simulator executes the pool's rules themselves, in either regime.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._distributions.bmap import stationary_vector
from .description import (
    INELIGIBLE,
    Cells,
    Description,
    Dispatch,
    Modulation,
    Moves,
    Partner,
    Pool,
    TransitionClass,
)


def clipped_targets(cells: Cells, moves: Moves) -> np.ndarray:
    """Target cells of `moves`, a level above `K` kept at `K` (the mean field's truncation)."""
    target = cells.index(np.minimum(moves.level, cells.K), moves.status)
    if np.any(target < 0):
        i = int(np.flatnonzero(target < 0)[0])
        raise ValueError(
            f"a move from cell {int(moves.source[i])} goes to (level {int(moves.level[i])}, status "
            f"{int(moves.status[i])}), which is not a cell"
        )
    return target


def chosen_factor(dispatch: Dispatch, x: Float[Array, " C"]) -> Float[Array, " C"]:
    r"""Per cell $c$ of key $\kappa$: $h(F_{\ge\kappa}, F_{>\kappa})$, the rate at which one server of the cell is
    chosen per unit of the stream's rate per server (0 for ineligible cells). $\sum_c x_c h_c = 1 - g(F_{\rm inel})$
    is the probability that some sampled server is eligible. The tails $F$ are reverse cumulative sums of the
    occupancy over the keys, so they keep their relative precision deep in the tail."""
    key = np.asarray(dispatch.key)
    eligible = key != INELIGIBLE
    ranks = np.unique(key[eligible])
    rank = np.where(eligible, np.searchsorted(ranks, key), ranks.size)
    mass = jax.ops.segment_sum(x, jnp.asarray(rank), num_segments=ranks.size + 1)
    F_ge = jnp.cumsum(mass[::-1])[::-1]  # F_ge[r]: keys of rank >= r, or ineligible
    h = dispatch.choice.join_factor(F_ge[:-1], F_ge[1:])
    return jnp.where(jnp.asarray(eligible), jnp.concatenate([h, jnp.zeros(1, h.dtype)])[rank], 0.0)


def stream_rate(dispatch: Dispatch, x: Float[Array, " C"]) -> Float[Array, ""]:
    """The stream's rate per server: its `rate`, or the rate at which servers start it."""
    if dispatch.origin is None:
        return dispatch.rate
    return jnp.sum(dispatch.origin.weight * x[np.asarray(dispatch.origin.source)])


def saturated_pool(desc: Description) -> Pool | None:
    """The description's pool when it is saturated in the mean field, else `None`."""
    pool = desc.environment
    return pool if isinstance(pool, Pool) and pool.saturated else None


def phase_generator(mod: Modulation) -> Float[Array, "m m"]:
    """The generator of a `Modulation`'s phase: its moves with and without a dispatch (per server)."""
    moves = mod.silent + jnp.sum(mod.rates, axis=0)
    off = moves - jnp.diag(jnp.diagonal(moves))
    return off - jnp.diag(jnp.sum(off, axis=1))


def check_modulation(desc: Description) -> Modulation | None:
    """The description's `Modulation` (or `None`), after its static checks: shapes, the modulated streams exist,
    have no `rate` of their own and start at no server; every other stream has a rate or an origin."""
    mod = desc.environment if isinstance(desc.environment, Modulation) else None
    S = len(desc.dispatches)
    streams = () if mod is None else tuple(int(s) for s in mod.streams)
    if mod is not None:
        m = mod.order
        if jnp.shape(mod.silent) != (m, m) or jnp.shape(mod.rates) != (len(streams), m, m) or m < 1:
            raise ValueError(f"the modulation's silent rates have shape {jnp.shape(mod.silent)} and its stream rates "
                             f"{jnp.shape(mod.rates)}; expected (m, m) and ({len(streams)}, m, m)")
        if len(set(streams)) != len(streams) or any(not 0 <= s < S for s in streams):
            raise ValueError(f"the modulation's streams {list(streams)} must be distinct dispatch indices 0..{S - 1}")
    for s, disp in enumerate(desc.dispatches):
        if s in streams:
            if disp.rate is not None or disp.origin is not None:
                raise ValueError(f"{disp.name}: a modulated stream takes its rate from the phase (rate=None) and "
                                 "starts at no server (origin=None)")
        elif disp.rate is None and disp.origin is None:
            raise ValueError(f"{disp.name}: a stream needs a rate, an origin, or a modulating phase")
    return mod


def averaged(desc: Description) -> Description:
    r"""The mean-field description of `desc`: a modulated stream $s$ at the constant rate $\gamma r_s$ ($r_s(i) =
    \sum_j$ `rates[s, i, j]`, $\gamma$ the phase's stationary law; module docstring), and no modulation. Other
    descriptions are returned unchanged."""
    mod = check_modulation(desc)
    if mod is None:
        return desc
    gamma = stationary_vector(phase_generator(mod))
    mean = jnp.einsum("i,sij->s", gamma, mod.rates)
    dispatches = list(desc.dispatches)
    for k, s in enumerate(mod.streams):
        dispatches[s] = dispatches[s]._replace(rate=mean[k])
    return desc._replace(dispatches=tuple(dispatches), environment=None)


def pooled(desc: Description, moves: Moves) -> tuple[Moves, np.ndarray]:
    """`moves` under a saturated pool (module docstring): those into the holding status from another go to the
    waiting status; also the mask of the moves that free a unit."""
    pool = saturated_pool(desc)
    status = np.asarray(moves.status)
    if pool is None:
        return moves, np.zeros(status.shape, bool)
    from_held = desc.cells.status[np.asarray(moves.source)] == pool.held
    takes = (status == pool.held) & ~from_held
    frees = from_held & (status != pool.held)
    return moves._replace(status=np.where(takes, pool.waiting, status)), frees


def pool_cells(cells: Cells, pool: Pool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per cell: whether it holds a unit, whether it waits, its redirect (a holding cell's waiting cell at its
    level, else itself) and its promotion (a waiting cell's holding cell at its level, else -1)."""
    held, waits = cells.status == pool.held, cells.status == pool.waiting
    redirect = np.where(held, cells.index(cells.level, pool.waiting), np.arange(cells.size))
    promote = np.where(waits, cells.index(cells.level, pool.held), -1)
    for name, bad in (("holding", held & (redirect < 0)), ("waiting", waits & (promote < 0))):
        if bad.any():
            raise ValueError(f"the pool's {name} cells {np.flatnonzero(bad).tolist()} have no "
                             f"{'waiting' if name == 'holding' else 'holding'} cell at their level")
    return held, waits, redirect, promote


def _promotion(desc: Description, x: Float[Array, " C"]) -> Partner:
    """The waiting server a freed unit goes to: uniform among the waiting (a `Partner` moving it to the holding
    status at its level)."""
    _, waits, _, promote = pool_cells(desc.cells, saturated_pool(desc))
    waiting = np.flatnonzero(waits)
    held = promote[waiting]
    mass = jnp.sum(x[waiting])
    safe = jnp.where(mass > 0, mass, 1.0)
    return Partner(waiting, held, jnp.where(mass > 0, x[waiting] / safe, 0.0))


def _classes(desc: Description, name: str, source, target, rate, frees, x) -> list[TransitionClass]:
    """One transition class, split in two under a saturated pool: the rows that free a unit carry the
    promotion of a waiting server."""
    if not frees.any():
        return [TransitionClass(name, source, target, rate)]
    out = [TransitionClass(name + " (frees a unit)", source[frees], target[frees], rate[frees], _promotion(desc, x))]
    if not frees.all():
        out.append(TransitionClass(name, source[~frees], target[~frees], rate[~frees]))
    return out


def transitions(desc: Description, x: Float[Array, " C"]) -> list[TransitionClass]:
    """The mean-field transition classes of `desc` at occupancy `x`, by the tail rule (module docstring); a
    modulating phase is averaged out (`averaged`)."""
    desc = averaged(desc)
    cells = desc.cells
    out = []
    for ev in desc.local_events:
        moves, frees = pooled(desc, ev.moves)
        out += _classes(desc, ev.name, np.asarray(moves.source), clipped_targets(cells, moves), moves.weight, frees, x)
    for disp in desc.dispatches:
        eff, frees = pooled(desc, disp.effect)
        src = np.asarray(eff.source)
        h = chosen_factor(disp, x)
        if disp.origin is None:
            out += _classes(desc, disp.name, src, clipped_targets(cells, eff), disp.rate * h[src] * eff.weight, frees,
                            x)
        else:
            if saturated_pool(desc) is not None:
                raise ValueError(f"{disp.name}: a stream with an origin cannot act under a saturated pool (a jump "
                                 "moves at most two servers)")
            partner = Partner(src, clipped_targets(cells, eff), h[src] * x[src] * eff.weight)
            out.append(TransitionClass(disp.name, np.asarray(disp.origin.source), clipped_targets(cells, disp.origin),
                                       disp.origin.weight, partner))
    return out


def drift(classes: list[TransitionClass], x: Float[Array, " C"],
          partner_rates: dict[str, Array] | None = None) -> Float[Array, " C"]:
    """$\\dot x$: every flow moves mass from its source to its target (a partner's too).

    `partner_rates`, by class name: the rate per server of that class's events, used for its partner's moves in
    place of the sum of its flows (which it equals at a consistent state; Newton's occupancy system,
    `jsmkt._models.newton`, makes a stream's rate an unknown of its own this way)."""
    dx = jnp.zeros_like(x)
    for tc in classes:
        flow = tc.rate * x[tc.source]
        dx = dx.at[tc.target].add(flow).at[tc.source].add(-flow)
        if tc.partner is not None:
            p = tc.partner
            total = jnp.sum(flow) if partner_rates is None or tc.name not in partner_rates else partner_rates[tc.name]
            pflow = total * p.prob
            dx = dx.at[p.target].add(pflow).at[p.source].add(-pflow)
    return dx



class JobFlows(NamedTuple):
    """Job flows per server of the arrival streams at occupancy `x` (rates, per unit time)."""

    offered: Array  # jobs brought by events that found an eligible server (those beyond the truncation included)
    accepted: Array  # jobs that joined (the throughput)
    waiting: Array  # jobs that joined (or were lost at the truncation) without starting service at once


def job_flows(desc: Description, x: Float[Array, " C"], stream: str | None = None) -> JobFlows:
    """`JobFlows` of every stream flagged `arrivals` (or of the one named `stream`), in the mean field (a
    modulating phase averaged out)."""
    desc = averaged(desc)
    cells = desc.cells
    jobs, busy = jnp.asarray(cells.jobs, x.dtype), jnp.asarray(cells.in_service, x.dtype)
    zero = jnp.zeros((), x.dtype)
    offered = accepted = waiting = zero
    names = [d.name for d in desc.dispatches if d.arrivals]
    if stream is not None and stream not in names:
        raise ValueError(f"stream={stream!r} is not an arrival stream of this model; its arrival streams are {names}")
    for disp in desc.dispatches:
        if not disp.arrivals or (stream is not None and disp.name != stream):
            continue
        eff = pooled(desc, disp.effect)[0]
        src = np.asarray(eff.source)
        tgt = clipped_targets(cells, eff)
        lost = np.asarray(eff.level) - np.minimum(np.asarray(eff.level), cells.K)
        flow = stream_rate(disp, x) * chosen_factor(disp, x)[src] * x[src] * eff.weight
        brought = jobs[tgt] - jobs[src] + jnp.asarray(lost, x.dtype)
        starts = jnp.maximum(busy[tgt] - busy[src], 0.0)
        offered = offered + jnp.sum(flow * brought)
        accepted = accepted + jnp.sum(flow * (jobs[tgt] - jobs[src]))
        waiting = waiting + jnp.sum(flow * (brought - starts))
    return JobFlows(offered, accepted, waiting)
