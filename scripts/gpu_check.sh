#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and CuPy: the GPU tests (`pytest -m gpu`: the CUDA suite on
# the CuPy driver, and the checks only a GPU can make), then the GPU benchmark, its JSON kept
# under benchmarks/results/ (and copied to $OUT when that is set).
#
#   scripts/gpu_check.sh            # the whole benchmark
#   scripts/gpu_check.sh --quick    # smaller sizes (the arguments go to bench_gpu.py)
#
# It needs numpy, cupy (any cupy-cuda1Nx wheel), pytest, pytest-timeout, pytest-asyncio and
# hypothesis; torch with CUDA adds the torch baselines. Wheels in .whl/ are installed first,
# into /tmp/site, for a machine with no index (fetch them with `pip download --no-deps
# --only-binary=:all: --python-version 3.12 ... -d .whl pytest-asyncio hypothesis
# sortedcontainers attrs`).
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset AF_CUDA                      # the CuPy driver, not the emulator
python3 -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())" \
    || { echo "no usable CuPy here: this script is for a GPU machine"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

# 8 test workers where pytest-xdist is there (the GPU machines have it: the suite took 2-2.5
# min on 8 workers on an H200), each test at most 240 s (kernels compile on first use in
# each worker)
workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n "${AF_GPU_WORKERS:-8}" --dist loadgroup)
python3 -m pytest -q -m gpu "${workers[@]}" --timeout 240 -p no:cacheprovider -rs tests 2>&1 \
    | tee /tmp/gpu_tests.log
tests=${PIPESTATUS[0]}
python3 benchmarks/bench_gpu.py "$@" 2>&1 | tee /tmp/gpu_bench.log
bench=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
    cp /tmp/gpu_tests.log /tmp/gpu_bench.log "$OUT"/ 2>/dev/null
    cp benchmarks/results/bench_gpu.json "$OUT"/ 2>/dev/null
fi
echo "gpu tests: exit $tests; benchmark: exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
