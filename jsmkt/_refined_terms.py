r"""The $1/N$ terms of a `Description` that the refined mean field (`jsmkt._refined`) needs besides the drift:
the jumps' second moment, the drift of streams that start at a server (their origin moves first), and the noise
of a modulating phase. Derived from the mean-field transitions (`jsmkt._models.meanfield`)."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._distributions.bmap import stationary_vector
from ._models.description import Description, TransitionClass
from ._models.meanfield import check_modulation, chosen_factor, clipped_targets, drift, phase_generator, transitions


def jump_second_moment(classes: list[TransitionClass], x: Float[Array, " C"]) -> Float[Array, "C C"]:
    r"""$G = \sum_{\text{jumps}} \text{flow}\;\ell\ell^\top$ in the occupancy space, $\ell$ the change of $x$ (times
    $N$) of one event: $e_t - e_s$, plus $e_{t'} - e_{s'}$ for a partner. For a class with a partner the pair
    flows factor as $a_i b_j$, so $G$ is accumulated from the two sides and their cross term, never per pair."""
    n = x.shape[0]
    G = jnp.zeros((n, n), x.dtype)

    def add_side(G, s, t, w):
        return G.at[t, t].add(w).at[s, s].add(w).at[t, s].add(-w).at[s, t].add(-w)

    for tc in classes:
        a = tc.rate * x[tc.source]
        s, t = jnp.asarray(tc.source), jnp.asarray(tc.target)
        if tc.partner is None:
            G = add_side(G, s, t, a)
            continue
        p = tc.partner
        b = p.prob
        ps, pt = jnp.asarray(p.source), jnp.asarray(p.target)
        A, B = jnp.sum(a), jnp.sum(b)
        G = add_side(G, s, t, a * B)
        G = add_side(G, ps, pt, b * A)
        u = jnp.zeros(n, x.dtype).at[t].add(a).at[s].add(-a)  # sum_i a_i l_i
        v = jnp.zeros(n, x.dtype).at[pt].add(b).at[ps].add(-b)  # sum_j b_j l'_j
        G = G + jnp.outer(u, v) + jnp.outer(v, u)
    return G


def origin_drift_correction(desc: Description, x: Float[Array, " C"]) -> Float[Array, " C"]:
    r"""$f^{(1)}$, the $1/N$ term of the drift of the $N$-server system that streams with an origin add: the origin
    moves first and the stream then samples among all $N$ servers, so it sees the occupancy
    $x + (e_{o'} - e_o)/N$. With $\Phi(x)$ the chosen server's displacement per unit of the stream's rate (the
    tail rule) and $u = \sum_o r_o x_o (e_{o'} - e_o)$ the origins' own drift, the exact drift is
    $R\,\Phi(x) + D\Phi(x)\,u/N + O(1/N^2)$, so $f^{(1)} = D\Phi(x)\,u$ (one `jax.jvp` per stream). Zero
    without such streams."""
    cells = desc.cells
    out = jnp.zeros_like(x)
    for disp in desc.dispatches:
        if disp.origin is None:
            continue
        o = disp.origin
        src, tgt = np.asarray(o.source), clipped_targets(cells, o)
        flow = o.weight * x[src]
        u = jnp.zeros_like(x).at[tgt].add(flow).at[src].add(-flow)
        eff = disp.effect
        es, et = np.asarray(eff.source), clipped_targets(cells, eff)

        def displacement(z, disp=disp, eff=eff, es=es, et=et):
            p = chosen_factor(disp, z)[es] * z[es] * eff.weight
            return jnp.zeros_like(z).at[et].add(p).at[es].add(-p)

        out = out + jax.jvp(displacement, (x,), (u,))[1]
    return out


def modulation_noise(desc: Description, x: Float[Array, " C"]):
    r"""The $1/N$ terms of a modulating phase at occupancy $x$ (`jsmkt.refined_mean_field`).

    With $\Phi_s(x)$ the occupancy's drift per unit rate of modulated stream $s$ (the tail rule), $r_s(i)$ its
    rate in phase $i$, $\bar r_s = \gamma r_s$, the drift in phase $i$ is $f_i = f_0 + \sum_s r_s(i)\Phi_s$. The
    phase's generator $G$ is $N$ times faster than the occupancy: the corrector $h_i = \sum_s \eta_s(i)\Phi_s / N$
    with $G\eta_s = -(r_s - \bar r_s)$, $\gamma\eta_s = 0$ ($\eta_s = (\mathbf1\gamma - G)^{-1}(r_s - \bar r_s)$)
    makes $x + h_J$ a process with the averaged drift $\bar f$ up to $O(1/N)$. Its martingale's jumps,
    $(\ell + h_j - h_i)$ at an event that moves the phase $i \to j$, give the diffusion
    $Q + \Phi^\top\Sigma\,\Phi$ (per $1/N$) with

    $$\Sigma = a + a^\top + c,\quad a_{ss'} = \textstyle\sum_{ij}\gamma_i R_s[i, j]\,(\eta_{s'}(j) - \eta_{s'}(i)),
      \quad c_{s's''} = \sum_{ij}\gamma_i G_{ij}(\eta_{s'}(j) - \eta_{s'}(i))(\eta_{s''}(j) - \eta_{s''}(i)),$$

    and its drift the $1/N$ bias $b = \sum_{s s'}\kappa_{ss'}\,D\Phi_{s'}[\Phi_s]$, $\kappa_{ss'} = (\gamma R_s)\,
    \eta_{s'}$ (the chosen server's law moves with the occupancy between the phase's moves). For a counting process
    ($\Phi_s$ the batch size) $\bar r + \Phi^\top\Sigma\Phi$ is the BMAP's asymptotic variance rate.

    Returns `(Phi, Sigma, kappa)`: `(S, C)`, `(S, S)`, `(S, S)` for the modulated streams, in order."""
    mod = check_modulation(desc)
    G = phase_generator(mod)
    m = mod.order
    gamma = stationary_vector(G)
    R = jnp.asarray(mod.rates)
    r = jnp.sum(R, axis=2)  # (S, m)
    rbar = r @ gamma
    Z = jnp.linalg.inv(jnp.outer(jnp.ones(m, G.dtype), gamma) - G)
    eta = (r - rbar[:, None]) @ Z.T  # (S, m): eta[s] = Z (r_s - rbar_s e)
    gR = jnp.einsum("i,sij->sj", gamma, R)  # (S, m): gamma R_s
    kappa = gR @ eta.T  # kappa[s, s'] = (gamma R_s) eta_s'
    a = kappa - (gamma[None, :] * r) @ eta.T  # a[s, s'] = sum_ij gamma_i R_s[i, j] (eta_s'(j) - eta_s'(i))
    c = (gamma[None, :] * eta) @ r.T
    c = c + c.T  # c[s', s''] = (gamma o eta_s'') r_s' + (gamma o eta_s') r_s''
    sigma = a + a.T + c
    return modulated_displacements(desc, x), sigma, kappa


def modulated_displacements(desc: Description, x: Float[Array, " C"]) -> Float[Array, "S C"]:
    r"""$\Phi_s(x)$, the occupancy's drift per unit rate of each modulated stream of `desc`, in order."""
    mod = check_modulation(desc)
    rows = []
    for s in mod.streams:
        one = desc._replace(local_events=(), dispatches=(desc.dispatches[s]._replace(rate=jnp.ones((), x.dtype)),),
                            environment=None)
        rows.append(drift(transitions(one, x), x))
    return jnp.stack(rows)


def third_jump_moment(classes: list[TransitionClass], x: Float[Array, " C"],
                      Rm: Float[Array, "n C"]) -> Float[Array, "n n n"]:
    r"""$T = \sum_{\text{jumps}} \text{flow}\;r\otimes r\otimes r$ in reduced coordinates, $r = R\ell$ the reduced
    jump ($R$ = `Rm`, the linear reduction). For a class with a partner the pair $(i, j)$ jumps by $r_i + r'_j$
    with flow $a_i b_j$, and $\sum_{ij} a_i b_j (r_i + r'_j)^{\otimes 3} = B\sum_i a_i r_i^{\otimes 3} +
    A\sum_j b_j r_j'^{\otimes 3} + \mathrm{sym}(G_a\otimes v) + \mathrm{sym}(G_b\otimes u)$ with $A = \sum a$,
    $B = \sum b$, $u = \sum a_i r_i$, $v = \sum b_j r'_j$, $G_a = \sum a_i r_i r_i^\top$, $G_b$ alike and
    $\mathrm{sym}(G\otimes v)_{pqr} = G_{pq}v_r + G_{pr}v_q + G_{qr}v_p$ (the convention of
    `jump_second_moment`). $n^3$ floats."""
    n = Rm.shape[0]
    T = jnp.zeros((n, n, n), x.dtype)

    def cube(a, r):
        return jnp.einsum("ai,bi,ci->abc", r * a[None, :], r, r)

    def sym(G, v):
        return G[:, :, None] * v[None, None, :] + G[:, None, :] * v[None, :, None] + G[None, :, :] * v[:, None, None]

    for tc in classes:
        a = tc.rate * x[tc.source]
        r = Rm[:, np.asarray(tc.target)] - Rm[:, np.asarray(tc.source)]
        if tc.partner is None:
            T = T + cube(a, r)
            continue
        p = tc.partner
        b = p.prob
        rp = Rm[:, np.asarray(p.target)] - Rm[:, np.asarray(p.source)]
        T = T + jnp.sum(b) * cube(a, r) + jnp.sum(a) * cube(b, rp)
        T = T + sym((r * a[None, :]) @ r.T, rp @ b) + sym((rp * b[None, :]) @ rp.T, r @ a)
    return T


def _complex_schur(A: Float[Array, "n n"], host: bool | None = None):
    """`(T, U)` with `A = U T U*`, `T` upper triangular (complex). JAX implements the Schur decomposition on the CPU
    backend only: elsewhere (or with `host=True`) SciPy's runs on the host through `jax.pure_callback`."""
    A = jax.lax.stop_gradient(A).astype(jnp.complex128)
    if host is None:
        host = jax.default_backend() != "cpu"
    if not host:
        return jax.scipy.linalg.schur(A, output="complex")

    def schur(a):
        import scipy.linalg

        a = np.asarray(a)
        out = [scipy.linalg.schur(m, output="complex") for m in a.reshape(-1, *a.shape[-2:])]
        T = np.stack([t for t, _ in out]).reshape(a.shape).astype(a.dtype)
        U = np.stack([u for _, u in out]).reshape(a.shape).astype(a.dtype)
        return T, U

    shape = jax.ShapeDtypeStruct(A.shape, A.dtype)
    return jax.pure_callback(schur, (shape, shape), A, vmap_method="expand_dims")


@jax.custom_jvp
def tensor_lyapunov3(A: Float[Array, "n n"], R: Float[Array, "n n n"]) -> Float[Array, "n n n"]:
    r"""Solve $\sum_l (A_{il} M_{ljk} + A_{jl} M_{ilk} + A_{kl} M_{ijl}) + R_{ijk} = 0$ for a stable $A$: the
    three-way Lyapunov equation of the third moments.

    Complex Schur form $A = U T U^*$ ($T$ upper triangular): with $\tilde R = R \times_1 U^* \times_2 U^*
    \times_3 U^*$ the operator becomes triangular in each index, and $X = M \times_1 U^* \times_2 U^* \times_3 U^*$
    is found by back substitution, $X_a$ from $(T + T_{aa} I) X_a + X_a T^\top = -\tilde R_a - \sum_{p>a} T_{ap}
    X_p$ and each row $X_{ab}$ of that from the triangular system $(T + (T_{aa} + T_{bb}) I)\, X_{ab} = \dots$
    ($n^2$ triangular solves, $O(n^4)$ work, $n^3$ memory; a unitary basis, so no eigenvector conditioning
    enters). The Schur decomposition is JAX's on the CPU backend, SciPy's through a host callback elsewhere
    (`_complex_schur`). Differentiated implicitly (`jax.custom_jvp`): the tangent solves the same equation with
    $R$ replaced by $\dot R + \dot A \cdot M$ (the operator with $\dot A$ in place of $A$, applied to $M$)."""
    n = A.shape[0]
    T, U = _complex_schur(A)
    Uh = U.conj().T

    def mode_product(X, B):  # X x_1 B x_2 B x_3 B
        X = jnp.tensordot(B, X, axes=(1, 0))
        X = jnp.einsum("bj,ajc->abc", B, X)
        return jnp.einsum("ck,abk->abc", B, X)

    Rt = mode_product(R.astype(T.dtype), Uh)
    eye = jnp.eye(n, dtype=T.dtype)

    def outer(i, X):
        a = n - 1 - i
        rhs = -Rt[a] - jnp.tensordot(T[a], X, axes=1)  # X_p = 0 for p <= a so far

        def inner(j, Y):
            b = n - 1 - j
            rb = rhs[b] - T[b] @ Y  # Y_q = 0 for q <= b so far
            yb = jax.scipy.linalg.solve_triangular(T + (T[a, a] + T[b, b]) * eye, rb, lower=False)
            return Y.at[b].set(yb)

        return X.at[a].set(jax.lax.fori_loop(0, n, inner, jnp.zeros((n, n), T.dtype)))

    X = jax.lax.fori_loop(0, n, outer, jnp.zeros((n, n, n), T.dtype))
    return mode_product(X, U).real


def _apply3(A, M):
    r"""$\sum_l (A_{il} M_{ljk} + A_{jl} M_{ilk} + A_{kl} M_{ijl})$."""
    return (jnp.einsum("il,ljk->ijk", A, M) + jnp.einsum("jl,ilk->ijk", A, M)
            + jnp.einsum("kl,ijl->ijk", A, M))


@tensor_lyapunov3.defjvp
def _tensor_lyapunov3_jvp(primals, tangents):
    A, R = primals
    dA, dR = tangents
    M = tensor_lyapunov3(A, R)
    return M, tensor_lyapunov3(A, dR + _apply3(dA, M))


def origin_shifted_moments(model, x: Float[Array, " C"], Rm: Float[Array, "n C"], eps: Float[Array, ""]):
    r"""The drift and jump second moment (reduced coordinates) of the streams that start at a server when their
    chooser sees the occupancy after the origin's move, $x + \varepsilon\,\delta_i$ ($\delta_i$ the origin cell
    $i$'s move, $\varepsilon = 1/N$): event $(i, j)$ (origin $i$ at flow $a_i$, chosen server $j$) has probability
    $b_j(x + \varepsilon\delta_i)$ and reduced jump $r_i + r'_j$. Returns `(drift, second_moment)`, shapes `(n,)`
    and `(n, n)`; their $\varepsilon$-derivatives at 0 are the $1/N$ and $1/N^2$ terms of the finite-N drift and
    the $1/N$ term of the jump covariance (`jsmkt._refined._refine2`). The first derivative of the drift is
    `origin_drift_correction` (reduced). `model` is a described model; one `transitions` per origin cell."""
    desc = model.description()
    names = {d.name for d in desc.dispatches if d.origin is not None}
    n = Rm.shape[0]
    drift_out = jnp.zeros(n, x.dtype)
    second = jnp.zeros((n, n), x.dtype)
    for k, tc in enumerate(model.transitions(x)):
        if tc.name not in names or tc.partner is None:
            continue
        src, tgt = np.asarray(tc.source), np.asarray(tc.target)
        a = tc.rate * x[src]
        deltas = jnp.zeros((src.size, x.shape[0]), x.dtype)
        deltas = deltas.at[np.arange(src.size), tgt].add(1.0).at[np.arange(src.size), src].add(-1.0)
        probs = jax.vmap(lambda dlt, k=k: model.transitions(x + eps * dlt)[k].partner.prob)(deltas)  # (i, j)
        p = tc.partner
        r = Rm[:, tgt] - Rm[:, src]  # (n, i)
        rp = Rm[:, np.asarray(p.target)] - Rm[:, np.asarray(p.source)]  # (n, j)
        w = a[:, None] * probs  # flow of the pair (i, j)
        drift_out = drift_out + r @ jnp.sum(w, axis=1) + rp @ jnp.sum(w, axis=0)
        cross = r @ w @ rp.T
        second = (second + (r * jnp.sum(w, axis=1)[None, :]) @ r.T + (rp * jnp.sum(w, axis=0)[None, :]) @ rp.T
                  + cross + cross.T)
    return drift_out, second
