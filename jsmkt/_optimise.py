r"""Gradient-based optimisation: one optax loop over the chosen leaves of a PyTree, shared by every use in jsmkt
(PH fits, choice numbers, repair allocation) and open to any loss.

Constraints are handled by reparametrisation (a loss of unconstrained parameters builds valid models: softmax for
probabilities, sigmoid for intervals, softplus for rates), never by clipping.
"""

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, PyTree


STOP_REASONS = ("converged", "max_steps", "interrupted", "nonfinite", "callback")


class OptimiseResult(eqx.Module):
    """The outcome of `jsmkt.optimise`.

    **Attributes:**

    - `params`: the best parameters met (those with the lowest finite loss), the whole PyTree (trainable and frozen
      leaves combined).
    - `loss`: their loss.
    - `aux`: the loss function's auxiliary output there (with `has_aux=True`; else `None`).
    - `best_step`: the step at which they were met (0: the starting point).
    - `steps`: the number of loss evaluations made.
    - `history`: the loss at every step, shape `(steps,)`.
    - `stop_reason`: why the loop stopped: `"converged"` (the loss changed by less than the tolerance for
      `patience` steps in a row, or the gradient's norm fell below `gtol`), `"max_steps"`, `"interrupted"` (Ctrl-C,
      or `KeyboardInterrupt` raised by the callback), `"nonfinite"` (a non-finite loss or gradient: the step that
      gave it is not taken) or `"callback"` (the callback returned `True`).
    """

    params: PyTree
    loss: Array
    aux: Any
    best_step: int = eqx.field(static=True)
    steps: int = eqx.field(static=True)
    history: Array
    stop_reason: str = eqx.field(static=True)

    @property
    def converged(self) -> bool:
        """Whether the loop stopped on its tolerance."""
        return self.stop_reason == "converged"


_WRAPPED: dict = {}


def _with_extra_args(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """`optax.with_extra_args_support(tx)`, the same object for the same `tx` (so that the compiled step of a loss
    is reused by later calls with that optimiser)."""
    out = _WRAPPED.get(tx)
    if out is None:
        if len(_WRAPPED) >= 256:
            _WRAPPED.clear()
        out = _WRAPPED[tx] = optax.with_extra_args_support(tx)
    return out


def _strong(tree: PyTree) -> PyTree:
    """`tree` with its arrays strongly typed. Python scalars give weakly typed arrays (in the start point, and in
    an optimiser's initial state), and `_step` returns them strongly typed: each change of type would compile the
    step again, once per step until every leaf has changed."""
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=x.dtype) if eqx.is_array(x) else x, tree)


@eqx.filter_jit
def _step(loss, tx, has_aux, trainable, frozen, opt_state, args):
    """One evaluation of the loss and its gradient at `trainable`, and the optimiser's update from there."""
    def f(tr):
        out = loss(eqx.combine(tr, frozen), *args)
        return out if has_aux else (out, None)

    (value, aux), grads = eqx.filter_value_and_grad(f, has_aux=True)(trainable)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats with integer step counts
        updates, opt_state = tx.update(grads, opt_state, trainable, value=value, grad=grads,
                                       value_fn=lambda tr: f(tr)[0])
    leaves = jax.tree_util.tree_leaves(grads)
    gnorm = jnp.sqrt(sum(jnp.sum(g**2) for g in leaves)) if leaves else jnp.zeros(())
    return eqx.apply_updates(trainable, updates), opt_state, value, aux, gnorm


def optimise(
    loss: Callable[..., Any],
    params: PyTree,
    optimiser: optax.GradientTransformation | None = None,
    *,
    steps: int = 1000,
    filter_spec: Any = eqx.is_inexact_array,
    args: tuple = (),
    has_aux: bool = False,
    rtol: float = 1e-10,
    atol: float = 0.0,
    patience: int = 10,
    gtol: float = 0.0,
    progress: bool = True,
    log_every: float = 2.0,
    name: str = "optimise",
    callback: Callable[[int, PyTree, float, Any], Any] | None = None,
) -> OptimiseResult:
    r"""Minimise `loss(params, *args)` with an optax optimiser over the leaves of `params` that `filter_spec`
    selects.

    Each step evaluates the loss and its gradient at the current parameters (one compiled call, reused across calls
    with the same loss function, optimiser and shapes) and applies the optimiser's update. The best point met is
    kept, so the result never is worse than the start; the loop stops on tolerance, on a step limit, on a non-finite
    loss or gradient, or on Ctrl-C, each time returning the best point so far.

    **Arguments:**

    - `loss`: a function `loss(params, *args) -> scalar` (or `(scalar, aux)` with `has_aux=True`), traceable by
      JAX. Constraints belong in it, by reparametrisation: it builds valid models from unconstrained leaves.
    - `params`: the starting point, any PyTree (e.g. a dict of arrays, or a model).
    - `optimiser`: an optax `GradientTransformation` (default `optax.adam(1e-2)`). Optimisers that need the loss
      itself, such as `optax.lbfgs()` with its line search, get `value`, `grad` and `value_fn` as extra arguments.
    - `steps`: the most loss evaluations.
    - `filter_spec`: which leaves are trained, as for `eqx.partition` (a function of a leaf, or a PyTree of
      booleans); the others stay as they are. Default: every floating-point array.
    - `args`: extra arguments of `loss` (data; not trained).
    - `rtol`, `atol`, `patience`: stop (`"converged"`) once the loss has changed by at most
      `rtol * |loss| + atol` in each of `patience` consecutive steps.
    - `gtol`: stop once the gradient's Euclidean norm is at most `gtol` (default 0: never).
    - `progress`: print a log line to stderr every `log_every` seconds (step, loss, best loss, gradient norm,
      speed) and one when the loop stops.
    - `name`: how the log lines begin.
    - `callback`: called after every step as `callback(step, params, loss, aux)`; returning `True` stops the loop
      (`"callback"`); raising `KeyboardInterrupt` stops it as Ctrl-C does.

    **Returns:** a `jsmkt.OptimiseResult` (`params`, `loss`, `history`, `stop_reason`, ...).

    !!! example

        ```python
        def loss(p):  # the mean of a PH(2) fitted to 1.5: rates by softplus, always valid
            S = jsmkt.coxian(jax.nn.softplus(p["u"]), jax.nn.sigmoid(p["v"]))
            return (S.mean - 1.5) ** 2

        res = jsmkt.optimise(loss, {"u": jnp.zeros(2), "v": jnp.zeros(1)}, optax.adam(0.05), steps=500)
        res.params, res.loss, res.stop_reason
        ```
    """
    if not callable(loss):
        raise ValueError(f"loss={loss!r} must be a function loss(params, *args) -> scalar")
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps={steps!r} must be a positive integer (the most loss evaluations)")
    if not (isinstance(patience, int) and patience >= 1):
        raise ValueError(f"patience={patience!r} must be a positive integer")
    for key, v in (("rtol", rtol), ("atol", atol), ("gtol", gtol), ("log_every", log_every)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{key}={v!r} must be a finite number >= 0")
    if not isinstance(args, tuple):
        raise ValueError(f"args={args!r} must be a tuple of the loss's extra arguments")
    if optimiser is None:
        optimiser = optax.adam(1e-2)
    if not isinstance(optimiser, optax.GradientTransformation):
        raise ValueError(f"optimiser={optimiser!r} must be an optax GradientTransformation (e.g. optax.adam(1e-2))")
    tx = _with_extra_args(optimiser)
    trainable, frozen = eqx.partition(_strong(params), filter_spec)
    if not jax.tree_util.tree_leaves(trainable):
        raise ValueError("filter_spec selects no leaf of params to train: give floating-point arrays, or a "
                         "filter_spec that selects some")
    with jax.numpy_dtype_promotion("standard"):
        opt_state = _strong(tx.init(trainable))

    history: list[float] = []
    best = (math.inf, trainable, None, 0)
    stop_reason = "max_steps"
    quiet_steps = 0
    t0 = last_log = time.perf_counter()
    step = 0

    def log(line: str) -> None:
        print(f"{name}: {line}", file=sys.stderr, flush=True)

    try:
        for step in range(1, steps + 1):
            new, new_state, value, aux, gnorm = _step(loss, tx, has_aux, trainable, frozen, opt_state, args)
            value, gnorm = float(value), float(gnorm)
            history.append(value)
            if not (math.isfinite(value) and math.isfinite(gnorm)):
                stop_reason = "nonfinite"
                break
            if value < best[0]:
                best = (value, trainable, aux, step - 1)
            if len(history) >= 2 and abs(history[-1] - history[-2]) <= rtol * abs(value) + atol:
                quiet_steps += 1
            else:
                quiet_steps = 0
            if progress and time.perf_counter() - last_log >= log_every:
                last_log = time.perf_counter()
                log(f"step {step}/{steps}  loss {value:.10g}  best {best[0]:.10g}  |grad| {gnorm:.3g}  "
                    f"({step / (last_log - t0):.3g} steps/s)")
            if callback is not None and callback(step, eqx.combine(trainable, frozen), value, aux) is True:
                stop_reason = "callback"
                break
            if quiet_steps >= patience or gnorm <= gtol:
                stop_reason = "converged"
                break
            trainable, opt_state = new, new_state
    except KeyboardInterrupt:
        stop_reason = "interrupted"
    best_loss, best_trainable, best_aux, best_step = best
    if progress:
        if math.isfinite(best_loss):
            log(f"stopped ({stop_reason}) after {len(history)} steps in {time.perf_counter() - t0:.3g} s; best loss "
                f"{best_loss:.10g} at step {best_step}")
        else:
            log(f"stopped ({stop_reason}) after {len(history)} steps; no finite loss met")
    return OptimiseResult(
        params=eqx.combine(best_trainable, frozen),
        loss=jnp.asarray(best_loss),
        aux=best_aux,
        best_step=best_step,
        steps=len(history),
        history=jnp.asarray(np.asarray(history, dtype=float)),
        stop_reason=stop_reason,
    )
