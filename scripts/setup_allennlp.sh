#!/usr/bin/env bash
# Builds the peer environment: AllenNLP 2.10.1's ELMo on torch 2.13.0 (CPU), Python 3.11, sharing
# the checkout's .venv (torch, numpy, h5py: scripts/peer_venv.sh). allennlp pins torch<1.13, so it
# goes in with --no-deps plus the packages its import needs (../shared/peers/setup_allennlp.sh's
# list; torchvision is stubbed by the peer scripts, ELMo never calls it).
# Usage: scripts/setup_allennlp.sh [VENV_DIR]   (default /tmp/peer-allennlp)
set -euo pipefail
V=${1:-/tmp/peer-allennlp}
[ -x "$V/bin/python" ] && "$V/bin/python" -c "import torch, allennlp" 2>/dev/null && { echo "$V ready"; exit 0; }
source "$(dirname "$0")/peer_venv.sh"
make_peer_venv "$V"
"$V/bin/pip" install -q --no-deps allennlp==2.10.1
"$V/bin/pip" install -q "transformers<5" "huggingface_hub<1.0" spacy cached-path lmdb dill base58 more-itertools fairscale
"$V/bin/python" -c "import allennlp"
echo "$V ready"
