"""Run in the AllenNLP 2.10.1 peer venv: AllenNLP's ``Elmo`` module on batches of sentences.

Usage: /tmp/peer-allennlp/bin/python tests/peers/allennlp_elmo.py CASES.json OUT.npz
CASES: a list of {options, weights, batches (lists of tokenized sentences, run in order through
one module: its biLM is stateful), num_output_representations, do_layer_norm,
keep_sentence_boundaries, scalar_mix_parameters (or null)}; dropout is 0. Writes, for case c,
c{c}_rep_{b}_{k} (B, T, D) and c{c}_mask_{b} (B, T).
"""
import json
import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parents[2].parent / "shared" / "peers"


def main() -> None:
    spec_path, out = sys.argv[1:3]
    sys.path.insert(0, str(PEERS))
    from allennlp_embed import _stub_torchvision_if_needed  # the peer's torchvision workaround

    _stub_torchvision_if_needed()
    import numpy as np
    import torch
    from allennlp.modules.elmo import Elmo, batch_to_ids

    arrays = {}
    for c, spec in enumerate(json.loads(Path(spec_path).read_text(encoding="utf-8"))):
        elmo = Elmo(spec["options"], spec["weights"], spec["num_output_representations"], dropout=0.0,
                    do_layer_norm=spec["do_layer_norm"], keep_sentence_boundaries=spec["keep_sentence_boundaries"],
                    scalar_mix_parameters=spec["scalar_mix_parameters"]).eval()
        with torch.no_grad():
            for b, batch in enumerate(spec["batches"]):
                result = elmo(batch_to_ids(batch))
                for k, rep in enumerate(result["elmo_representations"]):
                    arrays[f"c{c}_rep_{b}_{k}"] = rep.numpy()
                arrays[f"c{c}_mask_{b}"] = result["mask"].numpy().astype(bool)
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
