"""`simulate`'s limits and input checks: the arguments, the memory a run may take (ring buffers of arrival
times, time-average cells, histograms), the horizon that event times resolve, the default queue limit from the
load, and what the physics of a model allows to record."""

import math
import operator

import jax
import jax.numpy as jnp
import numpy as np

from .._models.base import AbstractDescribedModel
from .service import GeneralService


_MAX_RING_SLOTS = 2**30  # 8 GiB of arrival times; also keeps the flat int32 indices of the engines in range
_MAX_CELLS = 2**27  # time-integral cells (max_queue + 1) * m over all replications: 1 GiB per float64 array
_MAX_HORIZON = 1e10  # largest t1 / E[S]: sojourn times are differences of event times of size up to t1


def _int_arg(name: str, value, minimum: int) -> int:
    """A Python, NumPy or concrete 0-d JAX integer (not a bool) >= `minimum`."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} is traced (inside jit/grad/vmap); call simulate outside JAX transformations")
    try:
        if isinstance(value, (bool, np.bool_)) or np.asarray(value).dtype == bool:
            raise TypeError
        x = operator.index(value)
    except TypeError as e:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}") from e
    if x < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return x


def _real_arg(name: str, value) -> float:
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} is traced (inside jit/grad/vmap); call simulate outside JAX transformations")
    try:
        a = np.asarray(value)
        if a.shape != () or a.dtype.kind not in "iuf":
            raise TypeError
        x = float(a)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}={value!r} must be a real number") from e
    if not math.isfinite(x):
        raise ValueError(f"{name}={value!r} must be finite")
    return x


def _concrete(name: str, x) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise ValueError(
            f"{name} is traced: simulate was called inside jit/grad/vmap, or with traced model parameters; it needs "
            "concrete values (call it outside JAX transformations)"
        )
    return np.asarray(x, dtype=float)


def _check_sampler(service: GeneralService, key) -> None:
    """The sampler must map one key (of the run's kind) to one real scalar (checked abstractly, without running
    it)."""
    try:
        out = jax.eval_shape(service.sampler, key)
    except Exception as e:  # noqa: BLE001  (whatever the sampler raises when traced)
        raise ValueError(
            f"service={service!r}: calling its sampler on one JAX key failed ({type(e).__name__}: {e}); a sampler "
            "must be a JAX-traceable function key -> service time"
        ) from e
    dtype = getattr(out, "dtype", None)
    if getattr(out, "shape", None) != () or dtype is None or jnp.dtype(dtype).kind not in "biuf":
        got = f"shape {out.shape} and dtype {dtype}" if hasattr(out, "shape") else repr(out)
        raise ValueError(
            f"service={service!r}: its sampler returned {got}; it must return one real scalar (shape ()) per key"
        )


def _unstable(lam: float, mean_s: float, service) -> str:
    """The instability error, in the words of the models' value checks (`jsmkt solve` says the same)."""
    simulated = "" if service is None else ", with the service simulated instead of the model's"
    return (f"unstable: lam={lam:.6g} >= capacity 1/E[S]={1.0 / mean_s:.6g} per server (load rho=lam*E[S]="
            f"{lam * mean_s:.6g}{simulated}); no steady state exists: lower lam or speed up service")


def _default_max_queue(rho: float, scv: float, d_min: int, n: int) -> int:
    """Ring-buffer size from the load. The heavy-traffic mean queue length of one M/G/1 queue sets the scale; a
    queue that overflows `64 + 80 scale` is then an event of probability about e^-80. JSQ(d >= 2) has much lighter
    tails, but only while the servers are many: the jobs in excess of N, whose number has about the tail of that
    M/G/1 queue (N servers of rate 1 against one server of rate N), share N queues, so a few servers (e.g. N = 1,
    an M/G/1 queue whatever d) need about 80 scale / N more levels."""
    scale = min(rho * (1.0 + scv) / (2.0 * (1.0 - rho)), 2.0**62)  # an SCV of 1e308 stays finite
    if d_min == 1:
        return 64 + math.ceil(80.0 * scale)
    return 32 + math.ceil(scale) + math.ceil(80.0 * scale / n)


def _check_horizon(t1: float, mean_s: float) -> None:
    if t1 / mean_s > _MAX_HORIZON:
        raise ValueError(
            f"t1={t1!r} is {t1 / mean_s:.3g} mean service times (E[S]={mean_s:.6g}): event times near t1 resolve "
            f"sojourn times only to about {np.finfo(float).eps * t1 / mean_s:.1g} of E[S]; choose the time unit so "
            f"that t1 / E[S] <= {_MAX_HORIZON:.0e}"
        )


def _check_sizes(n_rep: int, n: int, max_queue: int, note: str, slot_bytes: int, cells: int, what: str,
                 bins: int) -> None:
    """The ring buffers of arrival times, the `bins` histogram bins and the time-average cells of one call fit the
    limits."""
    size = f"max_queue={max_queue}{note}"
    if n_rep * n * max_queue > _MAX_RING_SLOTS:
        raise ValueError(
            f"n_replications={n_rep} x n_servers={n} x {size} ring-buffer slots "
            f"({slot_bytes * n_rep * n * max_queue / 2**30:.3g} GiB) exceed the limit of {_MAX_RING_SLOTS:.3g}; "
            + ("give a smaller max_queue" if note else "lower max_queue") + " or n_replications (run replications "
            "in several calls)"
        )
    if n_rep * bins >= 2**31:
        raise ValueError(
            f"n_replications={n_rep} exceeds {(2**31 - 1) // bins}, the most whose sojourn-time histograms "
            f"({8 * bins / 2**10:.0f} KiB each) one call holds; run replications in several calls"
        )
    if n_rep * cells > _MAX_CELLS:
        raise ValueError(
            f"n_replications={n_rep} x {what} time-average cells exceed the limit of {_MAX_CELLS:.3g}; lower "
            "max_queue or n_replications (run replications in several calls)"
        )


def _check_waiting(model, structure) -> None:
    """Waiting times are recorded where a job starts service when it reaches the head of its FCFS queue: the head
    of a non-empty queue is always in service, and jobs leave one at a time; or where servers say which of their
    jobs is in service and start their waiting jobs in random order (`Structure.random_order`)."""
    name = type(model).__name__
    if structure.random_order:
        return
    if not structure.fcfs:
        raise ValueError(f"waiting_times=True: a {name} holds no FCFS queues (jobs move between servers), so no job "
                         "waits in a queue; give waiting_times=False")
    if structure.down > 1:
        raise ValueError(f"waiting_times=True: a {name} removes several jobs at once (batch service), so a job need "
                         "not reach the head of its queue to leave; give waiting_times=False")
    if isinstance(model, AbstractDescribedModel):
        cells = model.description().cells
        if not np.all(cells.in_service[cells.jobs >= 1] == 1):
            raise ValueError(f"waiting_times=True: the job at the head of a {name}'s queue is not always in service "
                             "(e.g. at a failed server), so reaching the head is not starting service; give "
                             "waiting_times=False")
