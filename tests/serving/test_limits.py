"""The server's records (``ServeLimits``, ``AccessOptions``) check their true-or-false fields as every
record does (``bounds.check_flags``): a library caller's "no" would read as true."""
from __future__ import annotations

import numpy as np
import pytest

from elmo_core.errors import SettingError
from serving.limits import AccessOptions, ServeLimits


@pytest.mark.parametrize("record, name, value", [
    (ServeLimits, "auto_truncate", "false"),
    (ServeLimits, "auto_truncate", 0),
    (AccessOptions, "protect_probes", "no"),
])
def test_a_flag_that_is_not_true_or_false_is_refused_naming_it(record, name, value):
    with pytest.raises(SettingError) as e:
        record(**{name: value})
    assert e.value.text == f"`{name}` must be true or false, got {type(value).__name__} {value!r}"


def test_numpy_bools_are_taken_as_python_bools():
    assert ServeLimits(auto_truncate=np.bool_(True)).auto_truncate is True
    access = AccessOptions(protect_probes=np.bool_(True))
    assert access.protect_probes is True and "/health" not in access.open_paths()
