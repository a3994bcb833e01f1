r"""Mitzenmacher's table with the refined mean field: E[T] with n servers to order 1/n, against the simulations.

The mean-field prediction is the n -> infinity limit; the simulated columns (n = 100, 500) lie above it by a 1/n
term that grows as lam -> 1. `jsmkt.refined_mean_field` computes that term from the model (E[T]_n = E[T] + c/n,
c = V_Q / lam by Little's law, V_Q the 1/n coefficient of the mean queue length). This script reads the stored
simulations of `compute.py` (no new simulation) and writes, per (d, lam) and n, the refined prediction, its and the
plain mean field's distance to the simulation in units of the simulation's 95 % half-width:
`refined.csv`, `refined.json` and `refined.md`.

    python experiments/mitzenmacher_table/refined.py [--out DIR] [--quick]
"""

import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402

import jsmkt  # noqa: E402


NAME = "mitzenmacher_table"


def main(argv=None) -> Path:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    out = _common.output_dir(NAME, args.out, args.quick)
    src = json.loads(_common.require_input(out / "mitzenmacher.json", f"{NAME}/compute.py", args.quick,
                                           args.out).read_text())
    ns = src["metadata"]["parameters"]["ns"]
    meta = _common.run_metadata(f"{NAME}/refined", {"source": "mitzenmacher.json", "ns": ns}, quick=args.quick)
    clock = _common.Clock()
    rows = []
    for r in src["rows"]:
        model = jsmkt.JSQd(r["lam"], d=r["d"])
        rmf = jsmkt.refined_mean_field(jsmkt.solve_fixed_point(model))
        c = float(jsmkt.mean_queue_length(model, rmf.correction)) / r["lam"]  # Little's law at every n
        row = dict(d=r["d"], lam=r["lam"], mean_field=r["mean_field"], coefficient=c)
        for n in ns:
            if f"sim_{n}" not in r:
                continue
            sim, ci = r[f"sim_{n}"], r[f"sim_{n}_ci"]
            row |= {f"sim_{n}": sim, f"sim_{n}_ci": ci, f"refined_{n}": r["mean_field"] + c / n,
                    f"refined_{n}_in_ci": (r["mean_field"] + c / n - sim) / ci,
                    f"mean_field_{n}_in_ci": (r["mean_field"] - sim) / ci}
        rows.append(row)
    meta["runtime"] = clock.runtime()
    _common.write_csv(out / "refined.csv", rows)
    _common.write_json(out / "refined.json", {"metadata": meta, "rows": rows})
    text = markdown(rows, ns)
    (out / "refined.md").write_text(text)
    print(text)
    return out


def markdown(rows, ns) -> str:
    head = "| d | λ | mean field | c (E[T]_n ≈ E[T] + c/n) | " + " | ".join(
        f"sim n = {n} | refined n = {n}" for n in ns) + " |"
    lines = ["Distances to the simulation in units of its 95 % half-width, in brackets (refined; plain mean field).",
             "", head, "|---" * (4 + 2 * len(ns)) + "|"]
    for r in rows:
        cells = []
        for n in ns:
            if f"sim_{n}" not in r:
                cells += ["–", "–"]
                continue
            cells += [f"{r[f'sim_{n}']:.4f} ± {r[f'sim_{n}_ci']:.4f}",
                      f"{r[f'refined_{n}']:.4f} ({r[f'refined_{n}_in_ci']:+.1f}; {r[f'mean_field_{n}_in_ci']:+.1f})"]
        lines.append(f"| {r['d']} | {r['lam']} | {r['mean_field']:.4f} | {r['coefficient']:.2f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
