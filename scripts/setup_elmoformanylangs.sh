#!/usr/bin/env bash
# Builds the peer environment: HIT-SCIR ELMoForManyLangs (PyPI `elmoformanylangs` 0.0.4.post2,
# identical to the GitHub HEAD b3de5f1) on torch 2.13.0 (CPU), Python 3.11, sharing the checkout's
# .venv (torch, numpy, h5py: scripts/peer_venv.sh). Its declared deps are unpinned; we pin overrides.
#   - overrides==3.1.0: modules/highway.py decorates Highway.forward with @overrides; overrides 7.x
#     checks it against torch.nn.Module.forward at import time and raises
#     "TypeError: Highway.forward: return type `Tensor` is not a `NoneType`". 3.1.0 (the version
#     AllenNLP of that era pinned) only checks that the name exists in a base class.
#   - torch 2.13: Model.load_model calls torch.load(...) without weights_only; the >=2.6 default
#     (weights_only=True) still loads the plain state-dict pickles, so no shim is needed.
# Usage: scripts/setup_elmoformanylangs.sh [VENV_DIR]   (default /tmp/peer-efml)
set -euo pipefail
V=${1:-/tmp/peer-efml}
[ -x "$V/bin/python" ] && "$V/bin/python" -c "import torch, elmoformanylangs, h5py" 2>/dev/null && { echo "$V ready"; exit 0; }
source "$(dirname "$0")/peer_venv.sh"
make_peer_venv "$V"
"$V/bin/pip" install -q --no-deps elmoformanylangs==0.0.4.post2 overrides==3.1.0
"$V/bin/python" -c "import elmoformanylangs, h5py"
echo "$V ready"
