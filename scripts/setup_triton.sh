#!/usr/bin/env bash
# Builds the side environment for the Triton test and for serving a Triton model repository on this
# machine: nvidia-pytriton's wheel bundles tritonserver (2.51) with its Python backend; it pins
# numpy < 2, so it lives apart from .venv, with what this project's inference package needs (the
# Python-backend model imports it from the checkout, on PYTHONPATH; docs/serving.md shows the command).
# Usage: scripts/setup_triton.sh [VENV_DIR]   (default /tmp/peer-triton)
set -euo pipefail
V=${1:-/tmp/peer-triton}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -x "$V/bin/python" ] && PYTHONPATH="$ROOT" "$V/bin/python" -c "import pytriton, inference" 2>/dev/null; then
  echo "$V ready"; exit 0
fi
source "$(dirname "$0")/peer_venv.sh"
make_peer_venv "$V"  # torch, h5py, safetensors, onnx, onnxruntime: the checkout's .venv's
"$V/bin/pip" install -q "nvidia-pytriton==0.7.0" "numpy<2"
PYTHONPATH="$ROOT" "$V/bin/python" -c "import pytriton, inference"
echo "$V ready"
