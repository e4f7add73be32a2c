#!/usr/bin/env bash
# Builds a side environment in which the real `allennlp elmo` command of AllenNLP 0.9.0 runs on
# Python 3.11 + torch 2.13.0 (CPU; the checkout's .venv's, shared: scripts/peer_venv.sh, with this
# venv's own numpy 1.x first). No file of allennlp is patched and no shim is loaded.
# allennlp 0.9 pins torch<=1.x and spacy<2.2 (neither exists for Python 3.11), so it goes in with --no-deps,
# followed by exactly the packages that `import allennlp.commands` (which imports every subcommand,
# and so every model, predictor and dataset reader) needs, with these pins:
#   numpy<2            spaCy 2.3.9 / thinc 7.4 wheels are built against the numpy 1.x ABI
#                      ("numpy.dtype size changed" under numpy 2).
#   spacy==2.3.9       spaCy 3 removed spacy.lang.en.tag_map (imported by allennlp/predictors/
#                      constituency_parser.py); 2.1.x has no cp311 wheel, 2.3.9 is the 2.x that has one.
#   overrides<4        overrides>=4 checks signatures at import and rejects allennlp 0.9's own classes
#                      ("ArrayField.empty_field: return type `None` is not a Field").
#   conllu==1.3.1, pytorch-transformers==1.1.0   allennlp 0.9.0's own pins (import only).
# Usage: scripts/setup_allennlp09.sh [VENV_DIR]   (default /tmp/peer-allennlp09)
# Then:  VENV_DIR/bin/allennlp elmo INPUT.txt OUT.hdf5 --all --options-file O.json --weight-file W.hdf5 --cuda-device -1
# Note: the command also writes stdout.log and stderr.log next to OUT.hdf5 (allennlp's prepare_global_logging).
set -euo pipefail
V=${1:-/tmp/peer-allennlp09}
[ -x "$V/bin/python" ] && "$V/bin/python" -c "import torch, allennlp.commands.elmo" >/dev/null 2>&1 && { echo "$V ready"; exit 0; }
source "$(dirname "$0")/peer_venv.sh"
make_peer_venv "$V"
"$V/bin/pip" install -q --no-deps allennlp==0.9.0
"$V/bin/pip" install -q "numpy<2" "spacy==2.3.9" "overrides<4" "conllu==1.3.1" "pytorch-transformers==1.1.0" \
    h5py flask flask-cors gevent boto3 numpydoc jsonpickle editdistance ftfy pytorch-pretrained-bert nltk \
    parsimonious unidecode word2number tensorboardX scipy scikit-learn sqlparse pytest
"$V/bin/python" -c "import allennlp.commands.elmo"
echo "$V ready"
