"""Benchmark: jsmkt's finite-N JAX simulator against a plain-Python event loop of the same system.

Model: JSQ(2), N = 1000 servers, Poisson arrivals of rate N * 0.9, H2 service with mean 1 and SCV 4
(`jsmkt.hyperexponential2(1.0, 4.0)`), FCFS, sampling with replacement, starting empty. Measured in one run:

- the first-call time of `jsmkt.simulate` (trace + compile, once per configuration);
- `jsmkt.simulate` with 1 replication and with 16 replications, over the same simulated time per replication:
  events/s (uniformisation events, self-loops included) and simulated time per wall second. On a CPU the PH
  engine applies one event per iteration of a loop that XLA compiles into a single kernel; the CPU's cores are
  exposed as JAX devices (`--cpu-devices`, default all), and the replications are split among them and run in
  parallel, one after another on each; on a GPU the engine evaluates speculative blocks of events batched over
  the replications (the engine and devices used are printed);
- a plain-Python discrete-event loop (heapq of completion times, deques of arrival times, the same time-averaged
  queue-length distribution and per-job sojourn times), written below, over the same simulated time: events/s
  (arrivals + departures) and simulated time per wall second;
- for scale, `reference/jsqd_h2.c`: jsmkt's own algorithm (uniformisation with self-loops, the same random-number
  generator and statistics) as a plain C loop built with the system's C compiler (`cc -O2 -march=native`), run as
  one process and as one process per core; and the same C loop with an exact event selection instead (no
  self-loops: the total rate follows the number of servers busy in each phase, and the completing server is drawn
  among those busy in its phase by rejection). `--no-native` skips both; without a compiler they are skipped;
- the algorithm of jsmkt's general-service engine, which fixes each job's completion time when it arrives (FCFS)
  and brings a server up to date only when an arrival samples it, so that only arrivals and completions are
  events: `jsmkt.simulate` with the same H2 distribution as a general sampler (`jsmkt.GeneralService`; the phase
  occupancies are then not tracked), and the same algorithm as a C loop (`reference/jsqd_h2.c ... fcfs`).

- the generic engine (`jsmkt._simulate.generic`, which runs any model given by `SimTables`) beside the fast PH
  engine, one replication each (one core): JSQ(2)-H2 on the tables derived from `jsmkt.JSQdPH`'s description,
  and `jsmkt.JSQdBatch` (batches of 1 or 2 jobs with probability 1/2 at rate 0.6 per server, exponential service
  of rate 1), the tables of its description: events/s, real events/s (events that changed a server or refused a job, no
  self-loops), their ratio to the fast engine's events/s on JSQ(2)-H2, and the targets >= 0.5x and >= 2e6 real
  events/s (`--sections generic` for this part alone, `--generic-time` for its run length); and `jsmkt.JSQdBMAP`
  with the same averaged batches (an MMPP-like BMAP: singles at rate 0.6 in phase 0, pairs at 0.6 in phase 1,
  switching at rate 0.05 per server), whose global phase the engine runs by thinning (each batch size drawn at
  its largest rate over the phases): its events/s and real events/s against the batch model's.

The speed-up compares simulated time per wall second (summed over replications or processes), since the loops
count different events: uniformisation adds phase changes and self-loops (about 1.5 events per arrival or
departure here). Medians of a few interleaved repeats. Run with `.venv/bin/python benchmarks/simulate.py`
(`--quick` for a shorter run; `--replications 1 16 1024` to time other batch sizes, e.g. on a GPU; `--services ph`
or `general` for one engine's rows only).

Measured on a 2-core CPU (AMD EPYC, XLA CPU, jax 0.10.2, 2 CPU devices), three full runs: plain Python
1.11-1.13e6 events/s; jsmkt 1.83-1.87e7 events/s with 1 replication (11.0-11.2x plain Python) and 3.96-4.01e7
with 16 (23.7-24.0x); the C loop of the same algorithm 4.43-4.49e7 events/s in one process (26.6-26.8x) and
8.66-8.85e7 in two (52.2-52.4x), with the same E[Q] and E[T] within noise; the C loop with exact selection
2.75-2.81e7 events/s in one process (24.7-24.8x) and 5.38-5.53e7 in two (47.9-49.4x). jsmkt runs at 0.45-0.46
of the speed of native code. The 1e6 events/s target passes; the 100x target does not, and is out of reach of
this algorithm on this machine: even the C loop gets half way. 100x would take about 1.6e8 uniformisation
events/s, 12 ns per event per core with everything included. The C loop takes about 23 ns; dropping the
self-loops removes a third of the events but makes each of the others dearer (a state-dependent rate, the
rejection draws), so the exact selection is no faster per simulated time, even in C. jsmkt takes about 50 ns per
event, of which about 30 ns in the one-kernel event loop that XLA compiles, 7 ns for the vectorised random
numbers and 5 ns for the statistics' scatters. (Before the engine ran the replications in place in the batch's
buffers and ran one batch after the warm-up when there are several, 16 replications gave 21.4-21.9x.)
Tried and measured: statistics accumulated inside the kernel (the cells' time integrals, or the block's sums of
sojourn times, departures and refused arrivals: no faster); events of 2-8 replications interleaved in one loop
iteration, so that the processor could overlap their chains (the loop no longer fits XLA's one-kernel size limit;
2.5-6.5x slower per event even with the limit raised); power-of-two cell packing, so that decoding a server's
state takes shifts instead of multiplications (max_queue 31 or 63 instead of 55: 75-77 against 58 ns per event,
XLA compiles the loop worse); 256, 1024 or 2048 events per block instead of 512 (60, 68, 65 against 58 ns).

With completion times fixed at arrival (the algorithm of jsmkt's general-service engine, here with H2 as a general
sampler; two full runs): jsmkt 11.7-11.9x plain Python with 1 replication and 26.6-29.5x with 16, against
11.0-11.1x and 23.6-23.7x for its PH engine in the same runs; the C loop of that algorithm 35.3-36.3x in one process
and 71.0-71.6x in two, the fastest native loop measured here and still short of 100x (jsmkt reaches 0.38-0.41 of
it). Events are then only
arrivals and completions, and no event looks beyond the d sampled servers; the phase occupancies are not tracked.

Measured on one NVIDIA H200 (jax 0.11.2, block PH engine, plain Python on the host's Xeon; `--time 40`, logs in
`benchmarks/results/h200-2026-11-30`): 1024 replications 6.6e8 events/s (474x plain Python), 16384 replications
1.96e9 events/s (1408x); 1 and 16 replications 5.5e5 and 1.5e7 events/s (0.4x and 10.9x): a loop iteration costs
tens of microseconds on a GPU, which only many replications share.
"""

import argparse
import collections
import heapq
import math
import os
import pathlib
import platform
import random
import shutil
import statistics
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import jax.random as jr

import _common
import jsmkt
from jsmkt._simulate import plan
from jsmkt._simulate.plan import _sequential_engine


N, LAM, D, SCV = 1000, 0.9, 2, 4.0
NATIVE_SOURCE = pathlib.Path(__file__).parent / "reference" / "jsqd_h2.c"
TARGET_EVENTS_PER_S = 1e6
TARGET_SPEEDUP = 100.0
BATCH_RATE, BATCH_SIZES = 0.6, (0.5, 0.5)  # the batch model of the generic section: job load 0.9
# The BMAP of the generic section: the batch model's averaged batches, from two phases that switch slowly
BMAP_C = [[-0.65, 0.05], [0.05, -0.65]]
BMAP_D = [[[0.6, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.6]]]
TARGET_GENERIC_RATIO = 0.5  # generic engine's events/s against the fast PH engine's, one replication
TARGET_GENERIC_REAL = 2e6  # generic engine's real events/s, one replication (one core)


def python_jsqd_h2(n, lam, d, scv, t1, warmup, seed):
    """JSQ(d) with balanced-means H2 service (mean 1): a plain discrete-event simulation.

    Returns (events, mean queue length, mean sojourn time); events are arrivals and departures."""
    rng = random.Random(seed)
    rand, expo, randrange = rng.random, rng.expovariate, rng.randrange
    p1 = 0.5 * (1.0 + math.sqrt((scv - 1.0) / (scv + 1.0)))
    r1, r2 = 2.0 * p1, 2.0 * (1.0 - p1)
    queues = [collections.deque() for _ in range(n)]  # arrival times, FCFS
    qlen = [0] * n
    kmax = 256
    count = [0] * (kmax + 2)  # servers with exactly k jobs
    count[0] = n
    area = [0.0] * (kmax + 2)  # time integral of count[k] over [warmup, t]
    last = [0.0] * (kmax + 2)
    heap = []  # (completion time, server)
    next_arr = expo(n * lam)
    soj_sum, n_jobs, events = 0.0, 0, 0

    def service():
        return expo(r1) if rand() < p1 else expo(r2)

    def move(k_from, k_to, t):
        tw = t if t > warmup else warmup
        a = last[k_from] if last[k_from] > warmup else warmup
        area[k_from] += count[k_from] * (tw - a)
        last[k_from] = t
        count[k_from] -= 1
        a = last[k_to] if last[k_to] > warmup else warmup
        area[k_to] += count[k_to] * (tw - a)
        last[k_to] = t
        count[k_to] += 1

    while True:
        if heap and heap[0][0] < next_arr:
            t, s = heapq.heappop(heap)
            if t > t1:
                break
            arrived = queues[s].popleft()
            k = qlen[s]
            qlen[s] = k - 1
            move(k, k - 1, t)
            if t > warmup:
                soj_sum += t - arrived
                n_jobs += 1
            if k > 1:
                heapq.heappush(heap, (t + service(), s))
        else:
            t = next_arr
            if t > t1:
                break
            next_arr = t + expo(n * lam)
            best = randrange(n)
            bq = qlen[best]
            for _ in range(d - 1):
                c = randrange(n)
                if qlen[c] < bq:
                    best, bq = c, qlen[c]
            queues[best].append(t)
            qlen[best] = bq + 1
            move(bq, bq + 1, t)
            if bq == 0:
                heapq.heappush(heap, (t + service(), best))
        events += 1
    for k in range(kmax + 2):
        a = last[k] if last[k] > warmup else warmup
        area[k] += count[k] * (t1 - a)
    mean_queue = sum(k * area[k] for k in range(kmax + 2)) / (n * (t1 - warmup))
    return events, mean_queue, soj_sum / max(n_jobs, 1)


def h2_sampler(h2):
    """A sampler of the two-phase hyperexponential `h2` (a `jsmkt.PH` without phase changes: the phase, then an
    exponential time at its rate), for `jsmkt.GeneralService`. `PH.sample` would do as well, but its generic loop to
    absorption made the run 1.65x slower, which would time the sampler rather than the engine."""
    p1, rate1, rate2 = h2.alpha[0], -h2.T[0, 0], -h2.T[1, 1]

    def sample(key):
        k_phase, k_time = jr.split(key)
        rate = jnp.where(jr.uniform(k_phase, dtype=jnp.float64) < p1, rate1, rate2)
        return jr.exponential(k_time, dtype=jnp.float64) / rate

    return sample


def cpu_model():
    """The processor's model name (Linux), else what `platform` knows."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} logical cores"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_native(workdir):
    """Compile the C reference of jsmkt's uniformised engine (`reference/jsqd_h2.c`); None (with the reason
    printed) without a working C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        print("C reference: skipped (no C compiler found; set CC)")
        return None
    exe = pathlib.Path(workdir) / "jsqd_h2"
    build = subprocess.run([cc, "-O2", "-march=native", "-o", str(exe), str(NATIVE_SOURCE), "-lm"],
                           capture_output=True, text=True)
    if build.returncode != 0:
        print(f"C reference: skipped ({cc} failed: {build.stderr.strip()[:200]})")
        return None
    return exe


def run_native(exe, processes, t1, warmup, max_queue, seed, select="uniform"):
    """Run `processes` copies of the C reference at once (one per core), with its `select` event selection
    (`uniform`: jsmkt's PH engine; `exact`: no self-loops; `fcfs`: jsmkt's general-service engine). Returns
    (wall s, events, E[Q], E[T]): the event loops' longest wall time (as each measures it, without the process
    start) and the events summed."""
    args = [str(N), str(LAM), str(D), str(SCV), str(t1), str(warmup)]
    procs = [subprocess.Popen([str(exe), *args, str(seed * 100 + j), str(max_queue), select],
                              stdout=subprocess.PIPE, text=True) for j in range(processes)]
    outs = [p.communicate()[0].split() for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"the C reference failed: {outs}")
    wall = max(float(o[1]) for o in outs)
    return wall, sum(int(o[0]) for o in outs), float(outs[0][2]), float(outs[0][3])


def generic_section(t_sim, repeats, verbose):
    """The generic engine (`jsmkt._simulate.generic`, a model given by tables) beside the fast PH engine, one
    replication each (one core), medians of `repeats` interleaved runs of `t_sim` time units: JSQ(2) with H2
    service on the tables of its description (`simulate(..., engine="generic")`) and `jsmkt.JSQdBatch`, against
    the fast engine on the same H2 model."""
    h2 = jsmkt.hyperexponential2(1.0, SCV)
    model = jsmkt.JSQdPH(LAM, h2, d=D)
    batch = jsmkt.JSQdBatch(BATCH_RATE, jnp.asarray(BATCH_SIZES), d=D)
    bmap = jsmkt.JSQdBMAP(jsmkt.BMAP(BMAP_C, BMAP_D), d=D)
    rows = {
        "fast": ("fast PH engine, JSQ(2)-H2", lambda t, k: jsmkt.simulate(model, N, t, key=k, engine="fast")),
        "generic": ("generic engine, JSQ(2)-H2 (JSQdPH's description)",
                    lambda t, k: jsmkt.simulate(model, N, t, key=k, engine="generic")),
        "batch": (f"generic engine, JSQdBatch (rate {BATCH_RATE}, sizes 1, 2)",
                  lambda t, k: jsmkt.simulate(batch, N, t, key=k)),
        "bmap": ("generic engine, JSQdBMAP (same batches, 2 phases)", lambda t, k: jsmkt.simulate(bmap, N, t, key=k)),
    }
    print(f"\nGeneric engine: N = {N}, 1 replication (one core), {t_sim:g} time units (warm-up 10 %), medians of "
          f"{repeats} interleaved repeats")
    first = {}
    for name, (_, run) in rows.items():
        t0 = time.perf_counter()
        run(1.0, jr.PRNGKey(0))
        first[name] = time.perf_counter() - t0
    runs = {name: [] for name in rows}
    results = {}
    for i in range(repeats):
        for name, (label, run) in rows.items():
            t0 = time.perf_counter()
            res = run(t_sim, jr.PRNGKey(200 + i))
            wall = time.perf_counter() - t0
            runs[name].append((wall, res.events, res.real_events))
            results[name] = res
            if verbose:
                print(f"  repeat {i + 1}, {label}: {wall:.2f} s, {res.events / wall:.3e} events/s, "
                      f"{res.real_events / wall:.3e} real events/s", flush=True)

    def med(name):
        wall = statistics.median(w for w, _, _ in runs[name])
        return (wall, statistics.median(e for _, e, _ in runs[name]) / wall,
                statistics.median(r for _, _, r in runs[name]) / wall)

    W = 58
    header = (f"{'':{W}} {'wall s':>7} {'events/s':>11} {'real ev./s':>11} {'real/all':>9} {'vs fast':>8}   "
              "E[Q], E[T]")
    print(header)
    print("-" * len(header))
    _, fast_eps, _ = med("fast")
    for name, (label, _) in rows.items():
        wall, eps, rps = med(name)
        res = results[name]
        print(f"{label:{W}} {wall:7.2f} {eps:11.3e} {rps:11.3e} {res.real_events / res.events:9.3f} "
              f"{eps / fast_eps:7.2f}x   {res.mean_queue_length:.3f}, {res.mean_sojourn_time:.3f}")
    print()
    for name in ("generic", "batch", "bmap"):
        print(f"first call (trace + compile + a 1-unit run), {rows[name][0]}: {first[name]:.2f} s")
    (_, b_eps, b_rps), (_, m_eps, m_rps) = med("batch"), med("bmap")
    print(f"JSQdBMAP against JSQdBatch: {m_eps / b_eps:.2f}x the events/s, {m_rps / b_rps:.2f}x the real events/s")
    print()
    for name in ("generic", "batch"):
        label = rows[name][0]
        _, eps, rps = med(name)
        ratio = eps / fast_eps
        print(f"target: {label} >= {TARGET_GENERIC_RATIO:g}x the fast engine's events/s: {ratio:.2f}x  "
              f"{'PASS' if ratio >= TARGET_GENERIC_RATIO else 'MISS'}")
        print(f"target: {label} >= {TARGET_GENERIC_REAL:.0e} real events/s: {rps:.3e}  "
              f"{'PASS' if rps >= TARGET_GENERIC_REAL else 'MISS'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter simulated time and fewer repeats")
    parser.add_argument("--replications", type=_common.positive(int), nargs="+", default=[1, 16], metavar="R",
                        help="replication counts to time (default: 1 16; e.g. 1 16 1024 on a GPU)")
    parser.add_argument("--cpu-devices", type=_common.positive(int), default=os.cpu_count() or 1, metavar="K",
                        help="CPU cores exposed as JAX devices, over which replications are split (default: all)")
    parser.add_argument("--no-native", action="store_true",
                        help="skip the C reference of the same algorithm (built with the system's C compiler)")
    parser.add_argument("--time", type=_common.positive(float), default=None, metavar="T",
                        help="simulated time per replication and of the plain-Python run (default 600, --quick 200; "
                             "shorter for thousands of replications on a GPU)")
    parser.add_argument("--repeats", type=_common.positive(int), default=None, metavar="K",
                        help="interleaved repeats whose medians are printed (default 3, --quick 2)")
    parser.add_argument("--services", nargs="+", choices=["ph", "general"], default=["ph", "general"],
                        help="jsmkt rows to time: the PH engine, and H2 as a general sampler (default: both)")
    parser.add_argument("--sections", nargs="+", choices=["main", "generic"], default=["main", "generic"],
                        help="what to time: the main table (jsmkt against plain Python and C) and the generic "
                             "engine beside the fast one (default: both)")
    parser.add_argument("--generic-time", type=_common.positive(float), default=None, metavar="T",
                        help="simulated time of each run of the generic section (default 3000, --quick 600)")
    parser.add_argument("--verbose", action="store_true",
                        help="print each timed run as it ends (the table comes after all repeats)")
    parser.add_argument("--block", type=_common.positive(int), default=None, metavar="B",
                        help="events per loop iteration of the speculative-block PH engine (GPU), instead of "
                             "jsmkt's choice (see benchmarks/block_size.py)")
    args = parser.parse_args()
    if args.block is not None:
        plan._markov_block_size = lambda n, n_rep: args.block
    jsmkt.use_cpu_cores(args.cpu_devices)  # before JAX's first computation
    reps_list = args.replications
    t_sim = args.time if args.time is not None else 200.0 if args.quick else 600.0
    repeats = args.repeats if args.repeats is not None else 2 if args.quick else 3
    generic_t = args.generic_time if args.generic_time is not None else 600.0 if args.quick else 3000.0
    if "main" not in args.sections:
        generic_section(generic_t, repeats, args.verbose)
        return
    h2 = jsmkt.hyperexponential2(1.0, SCV)
    model = jsmkt.JSQdPH(LAM, h2, d=D)
    general = jsmkt.GeneralService(h2_sampler(h2), mean=1.0, scv=SCV)

    print(f"JSQ({D}), N = {N}, lam = {LAM}, H2 service (mean 1, SCV {SCV}); simulated time {t_sim:g} per "
          f"replication (warm-up 10 %), medians of {repeats} repeats")
    engine = "one event at a time (CPU)" if _sequential_engine(D) else "speculative blocks, batched"
    devices = jax.devices()
    print(f"jsmkt PH engine: {engine}; {len(devices)} {devices[0].platform} device(s) ({devices[0].device_kind}), "
          f"replications split among as many as divide their number; CPU: {cpu_model()}\n")

    jsmkt_rows = [(svc, r) for svc in ("ph", "general") if svc in args.services for r in reps_list]
    services = {"ph": None, "general": general}
    compile_s = {}
    for svc, r in jsmkt_rows:
        t0 = time.perf_counter()
        first = jsmkt.simulate(model, N, 1.0, key=jr.PRNGKey(0), n_replications=r, service=services[svc])
        compile_s[svc, r] = time.perf_counter() - t0
        if args.verbose:
            print(f"  first call, {svc} service, {r} replication(s): {compile_s[svc, r]:.2f} s", flush=True)

    workdir = tempfile.TemporaryDirectory()
    native = None if args.no_native else build_native(workdir.name)
    native_rows = [(select, p) for select in ("uniform", "exact", "fcfs") for p in sorted({1, args.cpu_devices})]
    native_rows = native_rows if native is not None else []

    rows = {"python": [], **{row: [] for row in jsmkt_rows}, **{("C", *row): [] for row in native_rows}}
    results = {}
    for i in range(repeats):  # interleaved, so that machine load hits every row alike
        t0 = time.perf_counter()
        ev, eq, et = python_jsqd_h2(N, LAM, D, SCV, t_sim, 0.1 * t_sim, seed=i)
        rows["python"].append((time.perf_counter() - t0, ev))
        results["python"] = (eq, et, None)
        if args.verbose:
            wall = rows["python"][-1][0]
            print(f"  repeat {i + 1}, plain Python: {wall:.2f} s, {ev / wall:.3e} events/s, "
                  f"{t_sim / wall:.4g} simulated time per second", flush=True)
        for svc, r in jsmkt_rows:
            t0 = time.perf_counter()
            res = jsmkt.simulate(model, N, t_sim, key=jr.PRNGKey(100 + i), n_replications=r, service=services[svc])
            rows[svc, r].append((time.perf_counter() - t0, res.events))
            results[svc, r] = (res.mean_queue_length, res.mean_sojourn_time, res.mean_sojourn_time_ci)
            if args.verbose:
                wall, ev = rows[svc, r][-1]
                print(f"  repeat {i + 1}, {svc} service, {r} replication(s): {wall:.2f} s, {ev / wall:.3e} "
                      f"events/s, {r * t_sim / wall:.4g} simulated time per second", flush=True)
        for select, p in native_rows:
            wall, ev, eq, et = run_native(native, p, t_sim, 0.1 * t_sim, first.max_queue, seed=i, select=select)
            rows[("C", select, p)].append((wall, ev))
            results[("C", select, p)] = (eq, et, None)

    def med(name):
        wall = statistics.median(w for w, _ in rows[name])
        events = statistics.median(e for _, e in rows[name])
        reps = 1 if name == "python" else name[-1]
        return wall, events / wall, reps * t_sim / wall

    py_wall, py_eps, py_tps = med("python")
    W = 66  # width of the row labels
    header = f"{'':{W}} {'wall s':>8} {'events/s':>12} {'sim. time/s':>12} {'vs Python':>10}   E[Q], E[T]"
    print(header)
    print("-" * len(header))
    eq, et, _ = results["python"]
    print(f"{'plain Python (heapq), 1 run':{W}} {py_wall:8.2f} {py_eps:12.3e} {py_tps:12.4g} {1.0:9.2f}x   "
          f"{eq:.3f}, {et:.3f}")
    speedups = {}
    for svc, r in jsmkt_rows:
        wall, eps, tps = med((svc, r))
        speedups[svc, r] = tps / py_tps
        eq, et, ci = results[svc, r]
        label = f"jsmkt.simulate, {r} replication" + ("s" if r > 1 else "")
        label += f" ({plan._n_shards(r, len(devices))} dev." + (
            ")" if _sequential_engine(D) or svc == "general" else f", block {plan._markov_block_size(N, r)})")
        label += ", H2 as a general sampler" if svc == "general" else ""
        print(f"{label:{W}} {wall:8.2f} {eps:12.3e} {tps:12.4g} {speedups[svc, r]:9.2f}x   "
              f"{eq:.3f}, {et:.3f} ± {ci:.2g}")
    native_speedups = {}
    for select, p in native_rows:
        wall, eps, tps = med(("C", select, p))
        native_speedups[select, p] = tps / py_tps
        eq, et, _ = results[("C", select, p)]
        kind = {"uniform": "same algorithm", "exact": "exact selection", "fcfs": "completion times at arrival"}[select]
        label = f"C reference, {kind}, {p} process" + ("es" if p > 1 else "")
        print(f"{label:{W}} {wall:8.2f} {eps:12.3e} {tps:12.4g} {native_speedups[select, p]:9.2f}x   "
              f"{eq:.3f}, {et:.3f}")
    print()
    for svc, r in jsmkt_rows:
        print(f"first call (trace + compile + a 1-unit run), {svc} service, {r:2d} replication(s): "
              f"{compile_s[svc, r]:.2f} s")
    print()
    best_eps = max(med(row)[1] for row in jsmkt_rows)
    print(f"target >= {TARGET_EVENTS_PER_S:.0e} events/s: {best_eps:.3e}  "
          f"{'PASS' if best_eps >= TARGET_EVENTS_PER_S else 'MISS'}")
    best = max(speedups.values())
    print(f"target >= {TARGET_SPEEDUP:g}x plain Python (simulated time per wall second): {best:.2f}x  "
          f"{'PASS' if best >= TARGET_SPEEDUP else 'MISS'}")
    if native_speedups:
        p = max(p for _, p in native_rows)
        best_of = {svc: max(v for (s, _), v in speedups.items() if s == svc) for svc in args.services}
        uniform, fcfs = native_speedups["uniform", p], native_speedups["fcfs", p]
        ph = f" (jsmkt's PH engine at its best: {best_of['ph'] / uniform:.2f} of it)" if "ph" in best_of else ""
        gen = (f" (jsmkt's general-service engine at its best: {best_of['general'] / fcfs:.2f} of it)"
               if "general" in best_of else "")
        print(f"for scale, C loops (cc -O2 -march=native), {p} process(es): jsmkt's uniformised PH algorithm "
              f"{uniform:.2f}x plain Python{ph}; without self-loops (exact selection) "
              f"{native_speedups['exact', p]:.2f}x; with completion times fixed at arrival {fcfs:.2f}x{gen}")
    if "generic" in args.sections:
        generic_section(generic_t, repeats, args.verbose)

if __name__ == "__main__":
    main()
