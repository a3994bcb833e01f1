"""The result of a simulation."""

import dataclasses
import math
from typing import Any

import numpy as np

from .._models.base import Occupancy
from .._errors import percentile_label
from .statistics import _percentile_args, _percentiles


@dataclasses.dataclass(frozen=True, eq=False)
class SimulationResult:
    r"""Statistics of a finite-N simulation (time averages over `[warmup, t1]`).

    Confidence half-widths (`*_ci`) are 95 % Student-t half-widths, from the independent replications when
    `n_replications >= 2` and from `n_batches` batch means of the single run otherwise (`ci_method` says which).

    **Attributes:**

    - `tails`: $s_k$, the time-averaged fraction of servers with at least $k$ jobs, $k = 0..$`max_queue`.
    - `tails_ci`: their half-widths.
    - `phase_tails`: $S_k^{(i)}$, the fraction of servers with at least $k$ jobs whose job in service is in phase
      $i$, shape `(max_queue, m)` for $k = 1..$`max_queue`; `None` for general (non-PH) service.
    - `phase_tails_ci`: their half-widths (or `None`).
    - `mean_queue_length`, `mean_queue_length_ci`: mean number of jobs per server (the time average of the jobs
      its cell holds; $\sum_{k\ge1} s_k$ for the JSQ models).
    - `mean_sojourn_time`, `mean_sojourn_time_ci`: mean time from arrival to departure, averaged directly over the
      jobs that left during `[warmup, t1]` (FCFS queues, or servers whose waiting jobs start in random order, as
      own-orbit retrials); for a model whose jobs move between servers (tables with `fcfs=False`, e.g.
      re-probing retrials), by Little's law, `mean_queue_length / throughput`.
    - `sojourn_time_percentiles`: `{50: ..., 90: ..., 99: ...}` (the `percentiles` asked of `simulate`), from a
      log-spaced histogram of all those jobs (bins of at most 0.4 % relative width) from E[S] * 2**-20 to
      E[S] * 2**20 (generic engine: from t1 * 2**-39 to t1 * 2); a percentile outside that range is reported as
      its nearer end. `None` where jobs move between servers (no per-job times).
    - `sojourn_time_percentiles_ci`: their 95 % Student-t half-widths, by sectioning: the spread of the
      percentiles of groups of replications (at most 32 groups; every replication when fewer) or, for one
      replication, of the batches.
    - `waiting_time_percentiles`, `waiting_time_percentiles_ci`: the same for the waiting times (arrival to start
      of service; 0 for a job that did not wait) with `simulate(..., waiting_times=True)`, else `None`.
    - `sojourn_time_histograms`, `waiting_time_histograms`: the histograms by section (rows), from which
      `sojourn_time_percentile` and `waiting_time_percentile` give any other percentile; `histogram_lo` is the
      key of their lower edge.
    - `events`: events processed, summed over replications (warm-up and, for uniformised engines, the self-loops
      of uniformisation included).
    - `real_events`: the events among them that changed a server's cell or refused a job, summed over
      replications (warm-up included).
    - `n_jobs`: jobs whose sojourn times were recorded, summed over replications (0 where jobs move between
      servers).
    - `overflow`: arrivals that found a queue of `max_queue` jobs, or moves beyond the truncation (always 0:
      `simulate` raises otherwise).
    - `throughput`, `throughput_ci`: jobs accepted per unit time and server (those brought by arrival streams).
    - `cell_fractions`, `cell_fractions_ci`: the time-averaged fraction of servers in each cell, shape `(C,)`;
      cell `c` has level `cell_level[c]` and status `cell_status[c]`, named by `status_names`. For the JSQ models
      (either engine, unless a model's own tables number them otherwise) cell `k * m + i` holds `k` jobs, the job
      in service in phase `i` (status `i + 1`; status 0, `idle`, for `k = 0`).
    - `metrics`, `metrics_ci`: the model family's own metrics (`{}` for a family without), under the names
      `jsmkt solve` prints them (e.g. `mean_orbit_size`, `prob_blocked`, `availability`), and their half-widths;
      also attributes (`res.availability`, `res.availability_ci`). Each is the family's named observable
      (`AbstractDescribedModel.observables`), the function the mean-field metric of that name evaluates,
      evaluated on each replication's time-averaged occupancy (the estimate is their mean, as for
      `mean_sojourn_time`), or with one replication on the whole run's, its half-width by the delta method from
      the batches' occupancies. A ratio of flows is thus the ratio of their long-run averages. An observable that
      is nonlinear in the instantaneous occupancy (a choice pgf, e.g. `prob_blocked` with d1 >= 2) is evaluated at
      the time-averaged occupancy, not time-averaged itself: the two differ by a term of order 1/N (see the
      family's `observables`).
    - `occupancy`: the time-averaged `cell_fractions` as an `Occupancy` (cells named by level and status), which
      the family metric functions accept: `jsmkt.availability(model, res.occupancy)` equals `res.availability`.
    - `engine`: `"fast"` (the JSQ engines of `jsmkt._simulate.core`) or `"generic"`.
    - `n_servers`, `t1`, `warmup`, `n_replications`, `n_batches`, `max_queue`, `sampling`, `ci_method`: the run
      (`n_batches` is 1 with several replications, whose runs after the warm-up are not split).
    """

    tails: np.ndarray
    tails_ci: np.ndarray
    phase_tails: np.ndarray | None
    phase_tails_ci: np.ndarray | None
    mean_queue_length: float
    mean_queue_length_ci: float
    mean_sojourn_time: float
    mean_sojourn_time_ci: float
    sojourn_time_percentiles: dict[int, float] | None
    events: int
    n_jobs: int
    overflow: int
    n_servers: int
    t1: float
    warmup: float
    n_replications: int
    n_batches: int
    max_queue: int
    sampling: str
    ci_method: str
    real_events: int
    throughput: float
    throughput_ci: float
    cell_fractions: np.ndarray
    cell_fractions_ci: np.ndarray
    cell_level: np.ndarray
    cell_status: np.ndarray
    status_names: tuple[str, ...]
    engine: str
    sojourn_time_percentiles_ci: dict[int | float, float] | None = None
    waiting_time_percentiles: dict[int | float, float] | None = None
    waiting_time_percentiles_ci: dict[int | float, float] | None = None
    sojourn_time_histograms: np.ndarray | None = None
    waiting_time_histograms: np.ndarray | None = None
    histogram_lo: int = 0
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    metrics_ci: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def occupancy(self) -> Occupancy:
        """The time-averaged fraction of servers in each cell, named by level and status."""
        return Occupancy(self.cell_fractions, self.cell_level, self.cell_status, self.status_names)

    def __getattr__(self, name: str):
        # The family's metrics by name (called only when no field or method has the name).
        if not name.startswith("_") and name not in ("metrics", "metrics_ci"):
            metrics, cis = self.__dict__.get("metrics", {}), self.__dict__.get("metrics_ci", {})
            if name in metrics:
                return metrics[name]
            if name.endswith("_ci") and name[:-3] in cis:
                return cis[name[:-3]]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def sojourn_time_percentile(self, q: float) -> tuple[float, float]:
        """The `q`-th percentile of the sojourn time (`q` in (0, 100), e.g. 99.9) and its 95 % half-width, from the
        run's histograms (as `sojourn_time_percentiles`)."""
        return self._percentile("sojourn", self.sojourn_time_histograms, q, False)

    def waiting_time_percentile(self, q: float) -> tuple[float, float]:
        """The `q`-th percentile of the waiting time and its 95 % half-width (runs with
        `simulate(..., waiting_times=True)`)."""
        return self._percentile("waiting", self.waiting_time_histograms, q, True)

    def _percentile(self, what: str, hists, q, zero_below: bool) -> tuple[float, float]:
        if hists is None:
            why = ("the model's jobs move between servers (it holds no FCFS queues nor servers whose waiting jobs "
                   "start in random order), so no job's sojourn time is recorded" if what == "sojourn" else
                   "the run recorded no waiting times (simulate(..., waiting_times=True) records them)")
            raise ValueError(f"no {what}-time percentiles: {why}")
        (q,) = _percentile_args([q])
        est, ci = _percentiles(hists, (q,), self.histogram_lo, zero_below)
        return est[q], ci[q]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (Python floats, ints and lists). `tail` and `tail_ci` list $s_k$ from $k = 0$ up to
        the last $k$ with $s_k > 0$; `sojourn_time_percentiles` (keys `p50`, `p99.9`, ...) and its half-widths
        `sojourn_time_percentiles_ci` are `{}` where jobs move between servers; `waiting_time_percentiles` and
        `waiting_time_percentiles_ci` are there when the run recorded waiting times; each of `metrics` is there
        under its name, its half-width under the name with `_ci`. A percentile's key is `p` and the shortest text
        that reads back as its float (`jsmkt._errors.percentile_label`: `p99.9999999`)."""
        nz = np.nonzero(self.tails > 0)[0]
        last = int(nz[-1]) + 1 if nz.size else 1

        def f(x):
            x = float(x)
            return x if math.isfinite(x) else None

        def labelled(values):  # keys p50, p99.9, ...: `percentile_label`, exact and distinct
            return {percentile_label(p): f(v) for p, v in (values or {}).items()}

        return {
            "mean_queue_length": f(self.mean_queue_length),
            "mean_queue_length_ci": f(self.mean_queue_length_ci),
            "mean_sojourn_time": f(self.mean_sojourn_time),
            "mean_sojourn_time_ci": f(self.mean_sojourn_time_ci),
            "tail": [f(x) for x in self.tails[:last]],
            "tail_ci": [f(x) for x in self.tails_ci[:last]],
            "sojourn_time_percentiles": labelled(self.sojourn_time_percentiles),
            "sojourn_time_percentiles_ci": labelled(self.sojourn_time_percentiles_ci),
            **({"waiting_time_percentiles": labelled(self.waiting_time_percentiles),
                "waiting_time_percentiles_ci": labelled(self.waiting_time_percentiles_ci)}
               if self.waiting_time_percentiles is not None else {}),
            "events": int(self.events),
            "real_events": int(self.real_events),
            "throughput": f(self.throughput),
            "throughput_ci": f(self.throughput_ci),
            **{k: v for name in self.metrics
               for k, v in ((name, f(self.metrics[name])), (f"{name}_ci", f(self.metrics_ci[name])))},
            "n_jobs": int(self.n_jobs),
            "n_servers": int(self.n_servers),
            "t1": float(self.t1),
            "warmup": float(self.warmup),
            "n_replications": int(self.n_replications),
            "n_batches": int(self.n_batches),
            "max_queue": int(self.max_queue),
            "sampling": self.sampling,
            "ci_method": self.ci_method,
            "engine": self.engine,
        }

    def __repr__(self) -> str:
        return (
            f"SimulationResult(n_servers={self.n_servers}, t1={self.t1}, n_replications={self.n_replications}, "
            f"mean_queue_length={self.mean_queue_length:.6g} ± {self.mean_queue_length_ci:.2g}, "
            f"mean_sojourn_time={self.mean_sojourn_time:.6g} ± {self.mean_sojourn_time_ci:.2g}, "
            f"events={self.events})"
        )
