"""Several arrival classes and helpers (`JSQdClasses`) against independent single-queue formulas and closed forms."""

import jax.numpy as jnp
import numpy as np
import pytest

import jsmkt


def _solve(model):
    fp = jsmkt.solve_fixed_point(model)
    return fp, np.asarray(jsmkt.tails(model, fp))


def test_exponential_single_jobs_are_the_papers_closed_form():
    """Section 5 of the framework paper: pi_k = sum_j (lam_j / mu) pi_{k-1}^{d_j}."""
    lam, d, mu = [0.3, 0.5, 0.4], [1, 3, 2], 1.5
    model = jsmkt.JSQdClasses(lam, d=d, mu=mu)
    _, s = _solve(model)
    pi = [1.0]
    for _ in range(model.K):
        pi.append(sum(lj / mu * pi[-1] ** dj for lj, dj in zip(lam, d, strict=True)))
    np.testing.assert_allclose(s, pi, rtol=1e-12, atol=1e-15)


def test_d1_classes_with_ph_service_are_the_mph1_queue():
    """Every class samples one server: each server is an M/PH/1 queue at the total rate; Pollaczek-Khinchine
    E[Q] = rho + lam^2 E[S^2] / (2 (1 - rho))."""
    svc = jsmkt.hyperexponential2(1.0, 3.0)
    model = jsmkt.JSQdClasses([0.25, 0.35], d=[1, 1], service=svc)
    fp, _ = _solve(model)
    lam, rho, ES2 = 0.6, 0.6, 4.0  # E[S^2] = (1 + scv) E[S]^2
    assert float(jsmkt.mean_queue_length(model, fp)) == pytest.approx(rho + lam**2 * ES2 / (2 * (1 - rho)),
                                                                      rel=1e-10)


def test_d1_classes_with_batches_are_the_mxm1_queue():
    """d = 1: M^X/M/1 with the rate-weighted mixture of the batch laws, E[Q] = rho (E[X^2] + E[X]) / (2 E[X] (1 - rho))
    (jobs per unit time rho = lam E[X])."""
    model = jsmkt.JSQdClasses([0.2, 0.1], d=1, batch_sizes=[None, [0.0, 0.5, 0.5]], mu=1.2)
    fp, _ = _solve(model)
    EX = (0.2 * 1.0 + 0.1 * 2.5) / 0.3
    EX2 = (0.2 * 1.0 + 0.1 * (0.5 * 4 + 0.5 * 9)) / 0.3
    rho = 0.3 * EX / 1.2
    assert float(jsmkt.mean_queue_length(model, fp)) == pytest.approx(rho * (EX2 + EX) / (2 * EX * (1 - rho)),
                                                                      rel=1e-10)


def test_helpers_balance_the_cuts():
    """Exponential service with helpers: mu s_k + nu (1 - (1 - s_k)^f) = sum_j lam_j s_{k-1}^{d_j} at each cut,
    solved here level by level by bisection."""
    lam, d, nu, f = [0.5, 0.4], [2, 1], 0.3, 3
    model = jsmkt.JSQdClasses(lam, d=d, helper_rates=[nu], f=[f])
    _, s = _solve(model)
    ref = [1.0]
    for _ in range(model.K):
        rhs = sum(lj * ref[-1] ** dj for lj, dj in zip(lam, d, strict=True))
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if mid + nu * (1 - (1 - mid) ** f) < rhs else (lo, mid)
        ref.append(0.5 * (lo + hi))
    np.testing.assert_allclose(s, ref, rtol=1e-10, atol=1e-15)


def test_one_sample_helpers_with_ph_service_are_an_mph1_queue():
    """d = 1 and f = 1: a helper at rate nu ends the job in service at any busy server, so each server is an M/PH/1
    queue whose service is PH(alpha, T - nu I), min(S, Exp(nu)) (dense path: PH service with helpers)."""
    svc = jsmkt.erlang(2, 1.0)
    lam, nu = 0.7, 0.4
    model = jsmkt.JSQdClasses([lam], d=1, service=svc, helper_rates=[nu], f=[1])
    fp, _ = _solve(model)
    short = jsmkt.PH(svc.alpha, svc.T - nu * jnp.eye(2))
    ES = float(short.mean)
    ES2 = (1 + float(short.scv)) * ES**2
    rho = lam * ES
    assert float(jsmkt.mean_queue_length(model, fp)) == pytest.approx(rho + lam**2 * ES2 / (2 * (1 - rho)), rel=1e-10)
    assert float(model.load()) == pytest.approx(lam / (1.0 + nu))


def test_one_class_is_jsqd_and_jsqdph():
    a = jsmkt.JSQd(0.85, d=2)
    b = jsmkt.JSQdClasses([0.85], d=2, K=a.K)
    np.testing.assert_allclose(_solve(b)[1], _solve(a)[1], rtol=1e-12, atol=1e-15)
    svc = jsmkt.coxian2(1.0, 2.0)
    a = jsmkt.JSQdPH(0.8, svc, d=3)
    b = jsmkt.JSQdClasses([0.8], d=3, service=svc, K=a.K)
    fa, fb = jsmkt.solve_fixed_point(a), jsmkt.solve_fixed_point(b)
    np.testing.assert_allclose(np.asarray(fb.value), np.asarray(fa.value), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("build, match", [
    (lambda: jsmkt.JSQdClasses([0.3, -0.1]), r"lam\[1\]=-0.1"),
    (lambda: jsmkt.JSQdClasses([0.3, 0.2], d=[2]), "d=.*1 entries for 2 classes"),
    (lambda: jsmkt.JSQdClasses([0.3], batch_sizes=[[0.5, 0.6]]), r"batch_sizes\[0\].*sums to"),
    (lambda: jsmkt.JSQdClasses([0.3], batch_sizes=[[1.2, -0.2]]), r"batch_sizes\[0\]\[1\]=-0.2"),
    (lambda: jsmkt.JSQdClasses([0.3], helper_rates=[0.2], f=[]), "helper_rates has 1 entries and f has 0"),
    (lambda: jsmkt.JSQdClasses([0.3], mu=1.0, service=jsmkt.erlang(2)), "not both"),
    (lambda: jsmkt.JSQdClasses("0.3"), "lam='0.3'"),
    (lambda: jsmkt.JSQdClasses([0.3], d=[0]), r"d\[0\]=0"),
])
def test_bad_input_names_the_argument(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_instability_is_refused_with_the_capacity():
    model = jsmkt.JSQdClasses([0.6, 0.5], helper_rates=[0.05], f=[2])
    with pytest.raises(Exception, match=r"capacity 1/E\[S\] \+ sum of helper_rates=1.05"):
        jsmkt.solve_fixed_point(model)


def test_cli_solves_and_simulates_classes(tmp_path, capsys):
    """`model = "jsq-classes"`: one class with d = 1 and exponential service is the M/M/1 queue (E[Q] = rho/(1-rho));
    the simulation runs the same system; spec errors name the table."""
    from jsmkt import cli

    spec = tmp_path / "c.toml"
    spec.write_text('model = "jsq-classes"\nmu = 2.0\n[[classes]]\nlam = 0.6\nd = 1\n[[classes]]\nlam = 0.4\nd = 1\n')
    assert cli.main(["solve", str(spec), "--format", "json"]) == 0
    import json

    res = json.loads(capsys.readouterr().out)
    assert res["mean_queue_length"] == pytest.approx(1.0, rel=1e-10) and res["model"] == "JSQdClasses"
    assert res["classes"][1] == {"lam": 0.4, "d": 1.0, "batch_sizes": [1.0]}
    assert res["prob_wait_class_1"] == pytest.approx(0.5, rel=1e-10)
    assert cli.main(["simulate", str(spec), "--servers", "50", "--time", "400", "--replications", "2",
                     "--format", "json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert abs(sim["mean_queue_length"] - 1.0) < 0.15
    spec.write_text('model = "jsq-classes"\n[[classes]]\nlam = 0.6\nd = 1\nrate = 2\n')
    assert cli.main(["solve", str(spec)]) == 2
    assert "[[classes]] 1: unknown key(s) 'rate'" in capsys.readouterr().err
