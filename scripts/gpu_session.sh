#!/usr/bin/env bash
# A lent GPU machine's session, run there from the repository root with .whl/ carried
# (scripts/gpu_wheels.sh made it here): the wheels installed, then bench/gpu_check.py with its report
# straight into $OUT (after each step) and the shared model and corpus kept out of it (/tmp/gcwork,
# which a second call on the same warm machine reuses, compile cache included).
#   device run: bash scripts/gpu_session.sh [gpu_check's flags, e.g. --only model_alone]
set -u
t0=$(date +%s)
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/nvidia_smi.csv" 2>&1
python3 -c "import torch, triton, pyarrow; print(torch.__version__, triton.__version__, pyarrow.__version__, torch.cuda.get_device_name())" 2>&1 | tee "$OUT/versions.txt"
echo "setup $(( $(date +%s) - t0 )) s"
timeout 585 python3 bench/gpu_check.py --work /tmp/gcwork "$@" 2>&1 | tee "$OUT/gpu_check.log"
echo "total $(( $(date +%s) - t0 )) s"
