"""``ExportSpec``'s true-or-false field checked as every record's (``bounds.check_flags``): an export's
``token_dedup="no"`` would read as true, and so would a manifest's "false"."""
from __future__ import annotations

import pytest

from elmo_core.errors import SettingError
from formats.errors import ExportError
from formats.export_spec import ExportSpec


def test_token_dedup_must_be_true_or_false():
    with pytest.raises(SettingError) as e:
        ExportSpec(3, 32, 50, token_dedup="no")
    assert e.value.text == "`token_dedup` must be true or false, got str 'no'"


def test_a_manifest_token_dedup_that_is_not_a_bool_is_an_invalid_spec():
    d = ExportSpec(3, 32, 50, token_dedup=True).to_dict()
    assert ExportSpec.from_dict(d).token_dedup is True
    with pytest.raises(ExportError, match="manifest: invalid export spec .*token_dedup must be true or false"):
        ExportSpec.from_dict({**d, "token_dedup": "false"})
