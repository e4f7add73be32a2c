"""A user's scalar mix checked where the record holding it is made (``VectorRequest``, the export
spec, ``TrainOptions``' bounds), without the model code: ``elmo_core.scalar_mix`` applies the mix."""
from __future__ import annotations

import numbers
from typing import Sequence

from .kinds import Dtype
from .errors import SettingError

FLOAT32_MAX = Dtype.of("float32").max  # the model's arithmetic: a mix weight or gamma beyond it is infinite


def check_mix_settings(weights: Sequence[float] | None, gamma: float, output: str, mixes: bool,
                       largest: float = FLOAT32_MAX, dtype: str = "float32") -> None:
    """A user's scalar mix, checked where the record holding it is made: ``weights`` (the
    unnormalised s; None: equal) finite within float32's range (the model's arithmetic); ``gamma``
    finite with |gamma| <= ``largest``, the largest value of the output's ``dtype`` (a larger gamma
    makes every vector infinite); and neither given (gamma 1) for an ``output`` that does not mix
    (``mixes`` False), which would ignore them. SettingError naming the setting."""
    for i, s in enumerate(weights or ()):
        if not (isinstance(s, numbers.Real) and abs(s) <= FLOAT32_MAX):  # also refuses inf and nan
            raise SettingError(f"`mix`[{i}] must be a finite number within float32's range (|s| <= 3.4e38), "
                               f"got {s}")
    if not (isinstance(gamma, numbers.Real) and not isinstance(gamma, bool) and abs(gamma) <= largest):
        raise SettingError(f"`gamma` must be a finite number with |gamma| <= {largest:g} (the largest {dtype}), "
                           f"got {gamma!r}")
    given = [name for name, ignored in (("`mix`", weights is not None), ("`gamma`", gamma != 1.0)) if ignored]
    if given and not mixes:
        verb, it = ("apply", "them") if len(given) > 1 else ("applies", "it")
        raise SettingError(f"{' and '.join(given)} only {verb} to the mix (`output` mixed), not to `output` "
                           f"{output}: leave {it} out")
