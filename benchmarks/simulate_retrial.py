"""Benchmark: the generic simulator on the retrial family, own-orbit against re-probing retrials, in one run.

Models: `jsmkt.RetrialJSQ` with the parameters of `examples/retrial_reprobe.toml` (lam = 0.8, theta = 0.5 per orbit
customer, linear retrials, d1 = d2 = 2, mu = 1), N = 1000 servers, one replication on one CPU device, with
`retrial="own"` (a retrial tries its own server: a local event of the server) and `retrial="reprobe"` (the retrying
customer samples d2 servers: a dispatch started by its server, the stream's origin). Both run on the generic engine
(`jsmkt._simulate.generic`), which for tables without FCFS queues draws each server's clock events from a sum tree
of integer rate bounds (`_block_exact`: no uniformisation at the largest rate of a cell, whose orbit retrials at
j theta made most events self-loops). Printed, measured in this run:

- the first-call time of each (the mean-field truncation, trace and compile);
- events, real events (that changed a server or refused a job), the real fraction, the median wall time of
  `--repeats` interleaved runs of `--time` time units, and real events per second; the ratio of re-probing to
  own-orbit real events per second, target >= 0.5;
- the cost of each job's sojourn and waiting times: own-orbit retrials record them (their servers start their
  waiting jobs in random order, `Description.random_order`), `own-little` runs the same tables without random
  order (no per-job times: Little's law), `own+wait` also records the waiting times; the ratios of their real
  events per second, measured in the same interleaved runs;
- the same two models on the engine's other path, uniformisation at the largest rate of a cell (what ran these
  models before; `--uniform-time`, shorter, since most of its events are self-loops; `--uniform-time 0` skips it);
- the real fraction of the events of each retrial example (`RetrialJSQ.examples()` and `examples/retrial_*.toml`),
  N = 1000, `--example-time` time units, target >= 0.5.

Run: `.venv/bin/python benchmarks/simulate_retrial.py` (about 2 minutes on a 2-core CPU).
"""

import argparse
import pathlib
import statistics
import time
import tomllib

import _common
import jax
import jax.random as jr

import jsmkt
from jsmkt._simulate import jsq_tables, plan
from jsmkt._simulate.described import model_tables


ROOT = pathlib.Path(__file__).resolve().parents[1]


def spec_model(path: pathlib.Path) -> jsmkt.RetrialJSQ:
    """The retrial model of a spec file (its model keys only)."""
    spec = tomllib.loads(path.read_text())
    keys = ("lam", "theta", "d1", "d2", "mu", "retrial", "policy")
    return jsmkt.RetrialJSQ(**{k: spec[k] for k in keys if k in spec})


def run(model, n: int, t1: float, seed: int, **kw):
    return jsmkt.simulate(model, n, t1, key=jr.key(seed), n_batches=2, **kw)


def timed(models: dict, n: int, t1: float, repeats: int) -> dict:
    """Median wall time of `repeats` interleaved runs of each model (a model, or a model and `simulate`'s keyword
    arguments), with the last run's result."""
    walls = {name: [] for name in models}
    last = {}
    for r in range(repeats):
        for name, model in models.items():
            model, kw = model if isinstance(model, tuple) else (model, {})
            t0 = time.perf_counter()
            last[name] = run(model, n, t1, 100 + r, **kw)
            walls[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(walls[name]), last[name]) for name in models}


def table(rows: dict) -> dict:
    print(f"  {'model':10s} {'events':>10s} {'real':>10s} {'real/all':>9s} {'wall s':>8s} {'real events/s':>14s}"
          f" {'ns/real':>8s}")
    rates = {}
    for name, (wall, res) in rows.items():
        rates[name] = res.real_events / wall
        print(f"  {name:10s} {res.events:10.3e} {res.real_events:10.3e} {res.real_events / res.events:9.3f}"
              f" {wall:8.3f} {rates[name]:14.3e} {1e9 / rates[name]:8.0f}")
    return rates


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=_common.positive(int), default=1000, help="servers")
    ap.add_argument("--time", type=_common.positive(float), default=1000.0, help="time units per timed run")
    ap.add_argument("--repeats", type=_common.positive(int), default=5)
    ap.add_argument("--uniform-time", type=float, default=20.0, help="time units on the uniformised path (0: skip)")
    ap.add_argument("--example-time", type=_common.positive(float), default=100.0)
    args = ap.parse_args()
    jsmkt.use_cpu_cores(1)
    spec = ROOT / "examples" / "retrial_reprobe.toml"
    base = spec_model(spec)
    kw = dict(lam=base.lam, theta=base.theta, d1=base.choice1.number, d2=base.choice2.number, mu=base.mu)
    models = {"own": jsmkt.RetrialJSQ(**kw, retrial="own"), "reprobe": jsmkt.RetrialJSQ(**kw, retrial="reprobe")}
    own, top = models["own"], plan._mean_field_top(models["own"], args.n)
    # the same tables without random order: no per-job times (Little's law), at the truncation `own` runs at
    little = jsq_tables.TablesModel(lambda k: model_tables(own, k)._replace(random_order=False), float(own.load()),
                                    "own-little")
    jobs = {"own": (own, {"max_queue": top}), "own+wait": (own, {"max_queue": top, "waiting_times": True}),
            "own-little": (little, {"max_queue": top})}
    print(f"jax {jax.__version__} on {jax.default_backend()}, {len(jax.devices())} device(s); N = {args.n}, "
          f"{spec.name}'s parameters (lam={float(base.lam)}, theta={float(base.theta)}, d1=d2={kw['d1']}, linear)")

    for name, model in models.items():
        t0 = time.perf_counter()
        run(model, args.n, 1.0, 0)
        print(f"  first call {name}: {time.perf_counter() - t0:.2f} s")
    print(f"\nExact engine (sum tree of rate bounds), {args.time:g} time units, median of {args.repeats} "
          "interleaved runs")
    rates = table(timed(models, args.n, args.time, args.repeats))
    ratio = rates["reprobe"] / rates["own"]
    print(f"  re-probing / own-orbit real events per second: {ratio:.2f}  (target >= 0.5: "
          f"{'PASS' if ratio >= 0.5 else 'FAIL'})")

    for name, (model, kw) in jobs.items():
        run(model, args.n, 1.0, 0, **kw)
    print(f"\nPer-job times of own-orbit retrials (max_queue={top}), {args.time:g} time units, median of "
          f"{args.repeats} interleaved runs")
    job_rates = table(timed(jobs, args.n, args.time, args.repeats))
    print(f"  real events per second, per-job times / Little's law only: sojourn times "
          f"{job_rates['own'] / job_rates['own-little']:.2f}, with waiting times "
          f"{job_rates['own+wait'] / job_rates['own-little']:.2f}")

    if args.uniform_time > 0:
        exact = plan._exact_selection
        plan._exact_selection = lambda s: False
        # (random order runs on the exact engine only: own-orbit retrials without per-job times here)
        uniform = {"own": jobs["own-little"], "reprobe": models["reprobe"]}
        try:
            for model in uniform.values():
                model, kw = model if isinstance(model, tuple) else (model, {})
                run(model, args.n, 1.0, 0, **kw)
            print(f"\nUniformised at the largest rate of a cell (the engine's other path), {args.uniform_time:g} time "
                  "units, median of 3 (own-orbit retrials without per-job times)")
            old = table(timed(uniform, args.n, args.uniform_time, 3))
        finally:
            plan._exact_selection = exact
        print(f"  re-probing / own-orbit: {old['reprobe'] / old['own']:.2f}; exact / uniformised real events per "
              f"second: own (Little's law) {job_rates['own-little'] / old['own']:.1f}x, re-probing "
              f"{rates['reprobe'] / old['reprobe']:.1f}x")

    examples = {**jsmkt.RetrialJSQ.examples(),
                **{p.name: spec_model(p) for p in sorted((ROOT / "examples").glob("retrial_*.toml"))}}
    print(f"\nReal events of the retrial examples, N = {args.n}, {args.example_time:g} time units")
    worst = 1.0
    for name, model in examples.items():
        res = run(model, args.n, args.example_time, 1)
        frac = res.real_events / res.events
        worst = min(worst, frac)
        print(f"  {name:32s} events {res.events:10.3e}  real {res.real_events:10.3e}  real/all {frac:.4f}")
    print(f"  smallest real fraction {worst:.4f}  (target >= 0.5: {'PASS' if worst >= 0.5 else 'FAIL'})")


if __name__ == "__main__":
    main()
