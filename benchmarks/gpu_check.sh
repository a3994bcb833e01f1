#!/usr/bin/env bash
# The GPU check of jsmkt's batched evaluation, prepared to run in one go (under 8 minutes) on a machine with a CUDA
# GPU that already has JAX (with its CUDA plugin), Equinox, Diffrax, Optimistix, Lineax, optax, jaxtyping,
# matplotlib, pytest, hypothesis and scipy: it installs nothing and needs no network. From the repository root:
#
#     bash benchmarks/gpu_check.sh [OUTDIR]      # default: $OUT if set, else out/gpu_check
#
# Each step has its own time limit, so that a slow step does not stop the others, and writes its log to OUTDIR:
#   devices.log           JAX's version, devices and default backend;
#   simulate_tests.log    tests/test_simulate.py with the slow statistical checks, on the GPU: there the PH engine
#                         is the speculative-block one, batched over replications (checks of XLA's CPU backend
#                         skip themselves);
#   simulate_bench.log    benchmarks/simulate.py --quick with 1, 16, 1024 and 8192 replications (REPLICATIONS
#                         overrides the list);
#   fixed_point_bench.log benchmarks/fixed_point.py --quick (the batched fixed-point solve among others).
# Exit status 0 if every step passed. Set PYTHON to use another interpreter than python3.
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

step devices 60 "$py" -c "import jax, jsmkt; print('jax', jax.__version__, jax.devices(), jax.default_backend())"
step simulate_tests 200 "$py" -m pytest -q -p no:cacheprovider -m "" tests/test_simulate.py
# shellcheck disable=SC2086  # the list is split on purpose
step simulate_bench 150 "$py" benchmarks/simulate.py --quick --no-native --replications ${REPLICATIONS:-1 16 1024 8192}
step fixed_point_bench 60 "$py" benchmarks/fixed_point.py --quick
exit $status
