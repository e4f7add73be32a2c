"""What many tests share: tiny model options, random model directories, sample sentences, and
where the original TensorFlow reference fixture lives. Fixtures are in ``tests/conftest.py``."""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from elmo_core import BiLM, ElmoConfig, save_model
from elmo_core.init import init_bilm

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "elmo_tf_reference"

TINY_OPTIONS = {
    "lstm": {"dim": 24, "projection_dim": 8, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
    "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 4], [2, 8], [3, 8]], "n_highway": 1,
                 "n_characters": 262, "max_characters_per_token": 50, "activation": "relu"},
}


def tiny_options(**overrides) -> dict:
    """TINY_OPTIONS with 'lstm.x' / 'char_cnn.x' keys overridden."""
    opts = copy.deepcopy(TINY_OPTIONS)
    for key, value in overrides.items():
        section, name = key.split("__")
        opts[section][name] = value
    return opts


def make_model_dir(path: Path, options: dict, seed: int = 0, fmt: str = "hdf5", lstm_scale: float = 1.0) -> Path:
    """A random model in ``path``; ``lstm_scale`` > 1 drives cells and projections past the clips."""
    model = init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=seed)
    with torch.no_grad():  # random biases too, so every parameter matters
        for w in (model.lstm.w_input, model.lstm.w_state, model.lstm.w_proj):
            w.mul_(lstm_scale)
        g = torch.Generator().manual_seed(seed + 1)
        model.lstm.bias.normal_(0, 0.5, generator=g)
        model.encoder.proj_bias.normal_(0, 0.5, generator=g)
        model.encoder.convs[0].bias.normal_(0, 0.5, generator=g)
    save_model(model, path, fmt)
    return path


SENTENCES = [
    "The cat sat on the mat .".split(),
    ["Hi"],
    "A much longer sentence , with punctuation and numbers like 1 , 2 and 1790 in it .".split(),
    ["Café", "naïve", "日本語", "😀", "x" * 70],
    "Short one".split(),
]


def assert_as_accurate(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor, low: torch.dtype,
                       factor: float = 2.0, ulps: float = 8.0) -> None:
    """``got`` is as accurate as ``want``, both computing ``ref`` (float64) with products in ``low``.

    Two fp32 paths that differ only in summation order (another GEMM blocking for another batch
    shape, padding rows) or in where a reduced-precision rounding falls carry rounding errors of
    the same size, and which of them is closer to a third fp32 result depends on the CPU's kernels
    (AVX2 vs AVX-512 block sizes). So neither is held to the other: ``got``'s error against the
    float64 result must be at most ``factor`` times ``want``'s, plus ``ulps`` unit roundoffs of
    ``low`` at the output's scale (for an exact ``want``). A wrong state, step or mask gives errors
    of the output's own size, far outside the bound."""
    ref = ref.double()
    scale = float(ref.abs().max())
    err_got, err_want = float((got.double() - ref).abs().max()), float((want.double() - ref).abs().max())
    unit = float(torch.finfo(low).eps) / 2  # unit roundoff: 2**-24 fp32, 2**-8 bf16, 2**-11 fp16
    bound = factor * err_want + ulps * unit * scale
    assert err_got <= bound, f"error {err_got:.3g} against float64 > {bound:.3g} ({factor} x {err_want:.3g} + {ulps} ulp)"
