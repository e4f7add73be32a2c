"""Run in the AllenNLP peer venv: dump _ElmoBiLm's layers for sentences, to compare with ours.

Usage: /tmp/peer-allennlp/bin/python bench/allennlp_vectors.py OPTIONS WEIGHTS SENTENCES.json OUT.npz
Writes layer_k arrays (B, T, 2P) without the <S>/</S> positions, and the mask (B, T).
"""
import json
import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parents[1].parent / "shared" / "peers"


def main() -> None:
    options, weights, sentences, out = sys.argv[1:5]
    sys.path.insert(0, str(PEERS))
    from allennlp_embed import _stub_torchvision_if_needed  # the peer's torchvision workaround

    _stub_torchvision_if_needed()
    import numpy as np
    import torch
    from allennlp.modules.elmo import _ElmoBiLm, batch_to_ids
    from allennlp.nn.util import remove_sentence_boundaries

    sents = json.loads(Path(sentences).read_text(encoding="utf-8"))
    bilm = _ElmoBiLm(options, weights, requires_grad=False).eval()
    with torch.no_grad():
        result = bilm(batch_to_ids(sents))
    arrays = {}
    for k, act in enumerate(result["activations"]):
        layer, mask = remove_sentence_boundaries(act, result["mask"])
        arrays[f"layer_{k}"] = layer.numpy()
    arrays["mask"] = mask.numpy().astype(bool)
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
