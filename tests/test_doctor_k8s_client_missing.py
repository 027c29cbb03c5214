"""Without the `kubernetes` package, `doctor --k8s` and `diagnose --pod` name the package
and the install for a source checkout; the error used to blame `--pod` also in doctor,
which has no such flag (found running `doctor --k8s` on a fresh clone)."""

from __future__ import annotations

import sys

import pytest

from inferplane.doctor.k8s import KubernetesApi
from inferplane.errors import InferplaneError


def test_the_missing_client_names_the_package_not_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ImportError
    with pytest.raises(InferplaneError) as info:
        KubernetesApi()
    error = info.value
    assert error.field == "kubernetes" and "--pod" not in error.render()
    assert error.fix is not None and "pip install -e '.[k8s]'" in error.fix
    assert "'inferplane[k8s]'" in error.fix
