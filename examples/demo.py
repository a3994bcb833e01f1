"""jsmkt demo: JSQ(2) with Erlang-2 and hyperexponential service.

Solves the exact mean field, compares it with the published closed form, with its 1/N refinement and with a
finite-N simulation, takes gradients through the fixed point, and writes a plot of the tails.

    python examples/demo.py --out out
"""

import argparse
import pathlib
import time

import jax
import jax.random as jr
import matplotlib


matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import jsmkt  # noqa: E402
from jsmkt.plotting import plot_tails  # noqa: E402


jsmkt.use_cpu_cores()  # the simulations' replications run on every core


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="out")
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--time", type=float, default=3000.0)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    lam, d = 0.9, 2
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (name, service) in zip(axes, [("Erlang-2", jsmkt.erlang(2)), ("H2, SCV 4", jsmkt.hyperexponential2(1.0, 4.0))]):
        model = jsmkt.JSQdPH(lam, service, d=d)
        fp = jsmkt.solve_fixed_point(model)
        s_exact = np.asarray(jsmkt.tails(model, fp))
        rmf = jsmkt.refined_mean_field(fp)
        s_ref = np.asarray(jsmkt.tails(model, rmf.state(args.servers)))
        s_pub = np.concatenate([[1.0], np.asarray(jsmkt.published.ph_fixed_point(lam, service, d, model.K)).sum(1)])
        t0 = time.perf_counter()
        sim = jsmkt.simulate(model, args.servers, args.time, key=jr.PRNGKey(0), n_replications=8)
        t_sim = time.perf_counter() - t0

        # Sensitivities through the fixed point (implicit differentiation).
        def mean_T(lam_, model=model):
            m = jsmkt.JSQdPH(lam_, model.service, d=d, K=model.K)
            return jsmkt.mean_sojourn_time(m, jsmkt.solve_fixed_point(m))

        dT_dlam = float(jax.grad(mean_T)(lam))

        print(f"JSQ({d}), {name} service, lam = {lam}   (K = {model.K})")
        print(f"  {'':<10}{'exact mean field':>18}{'published':>14}{f'refined N={args.servers}':>16}"
              f"{f'simulation N={args.servers}':>22}")
        ET_sim, ci = sim.mean_sojourn_time, sim.mean_sojourn_time_ci
        ET_pub = float(jsmkt.published.ph_sojourn_time(lam, service, d))
        ET_ref = float(jsmkt.mean_queue_length(model, rmf.state(args.servers))) / lam  # Little's law
        print(f"  {'E[T]':<10}{float(jsmkt.mean_sojourn_time(model, fp)):>18.5f}{ET_pub:>14.5f}{ET_ref:>16.5f}"
              f"{f'{float(ET_sim):.5f} ± {float(ci):.5f}':>22}")
        for k in range(1, 5):
            print(f"  {f's_{k}':<10}{s_exact[k]:>18.5f}{s_pub[k]:>14.5f}{s_ref[k]:>16.5f}"
                  f"{float(sim.tails[k]):>22.5f} ± {float(sim.tails_ci[k]):.5f}")
        print(f"  dE[T]/dlam (implicit gradient) = {dT_dlam:.5f};  simulation took {t_sim:.1f} s "
              f"({int(sim.events):,} events)\n")

        plot_tails(ax, s_exact, label="exact mean field", color="k")
        plot_tails(ax, s_pub, label="published closed form", color="tab:red", linestyle="--", marker="x")
        n = len(s_exact)
        plot_tails(ax, np.asarray(sim.tails)[:n], ci=np.asarray(sim.tails_ci)[:n],  # 95 % half-widths
                   label=f"simulation, N = {args.servers}", color="tab:blue", linestyle="none", marker="s",
                   markerfacecolor="none", floor=1e-6)
        ax.set_title(f"JSQ({d}), {name}, λ = {lam}")
    fig.tight_layout()
    path = out / "demo_tails.png"
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
