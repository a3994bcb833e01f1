#!/usr/bin/env bash
# The GPU check of jsmkt's batched evaluation, prepared to run in one go (under 10 minutes) on a machine with a CUDA
# GPU that already has JAX (with its CUDA plugin), Equinox, Diffrax, Optimistix, Lineax, optax, jaxtyping,
# matplotlib, pytest, hypothesis and scipy: it installs nothing, needs no network, and runs jsmkt from the checkout
# (not installed). From the repository root:
#
#     bash benchmarks/gpu_check.sh [OUTDIR]      # default: $OUT if set, else out/gpu_check
#
# Each step has its own time limit, so that a slow step does not stop the others, and writes its log to OUTDIR.
# Most important first:
#   devices.log              JAX's version, devices and default backend, and nvidia-smi;
#   sweep_bench.log          benchmarks/sweep.py over 10^6 JSQ(2)-H2 points: jsmkt.sweep against the raw vmap of
#                            the same solve (target >= 0.8x) and >= 5 million E[T] points/s after compilation;
#   simulate_bench_many.log  benchmarks/simulate.py with 1024, 4096 and 16384 replications (40 time units each;
#                            the most that one call's arrival-time buffers allow at N = 1000 is about 19500);
#   simulate_bench.log       benchmarks/simulate.py with 1 and 16 replications (100 time units each);
#   block_size.log           benchmarks/block_size.py for 1024, 4096 and 16384 replications;
#   simulate_tests.log       tests/test_simulate.py, fast checks, on the GPU: there the PH engine is the
#                            speculative-block one, batched over replications (checks of XLA's CPU backend skip
#                            themselves); then the slow statistical checks (simulate_tests_slow.log), sized for a
#                            CPU: with few replications the GPU is slower, and the last ones may not finish;
#   fixed_point_bench.log    benchmarks/fixed_point.py --quick (the batched fixed-point solve among others);
#   simulate_general.log     benchmarks/simulate.py with H2 as a general sampler (the general-service engine,
#                            vmapped over replications on a GPU), 16 and 1024 replications of 20 time units.
# The PH rows above are timed alone (--services ph), the general-service engine's last, in its own step.
# Exit status 0 if every step passed. Set PYTHON to use another interpreter than python3.
# Logs of a run on an H200: benchmarks/results/h200-2026-11-30.
set -uo pipefail
out=${1:-${OUT:-out/gpu_check}}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0

step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s): $*"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc$([ "$rc" -eq 124 ] && echo ' (time limit)')"
    [ "$rc" -eq 0 ] || status=1
}

step devices 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; \
    $py -c \"import jax, jsmkt; print('jax', jax.__version__, 'jsmkt', jsmkt.__version__, jax.devices(), \
    jax.default_backend())\""
step sweep_bench 120 "$py" benchmarks/sweep.py --points 1000000 --rounds 3
bench=(benchmarks/simulate.py --no-native --repeats 2 --verbose)
step simulate_bench_many 120 "$py" "${bench[@]}" --services ph --time 40 --replications 1024 4096 16384
step simulate_bench 60 "$py" "${bench[@]}" --services ph --time 100 --replications 1 16
step block_size 75 "$py" benchmarks/block_size.py --replications 1024 4096 16384
step simulate_tests 90 "$py" -m pytest -q -p no:cacheprovider tests/test_simulate.py
step simulate_tests_slow 100 "$py" -m pytest -q -p no:cacheprovider -m slow --durations=0 tests/test_simulate.py
step fixed_point_bench 45 "$py" benchmarks/fixed_point.py --quick
step simulate_general 45 "$py" "${bench[@]}" --services general --time 20 --replications 16 1024
exit $status
