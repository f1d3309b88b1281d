"""Quantities: the operator's value comparison agrees with how the API server (emulator) rewrites them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from flotilla_operator.quantity import parse_quantity, same_quantity
from hypothesis import given
from hypothesis import strategies as st

from tests.support.k8s_defaults import canonical_quantity


@pytest.mark.parametrize(("written", "stored"), [
    ("0.5", "500m"), ("1.5Gi", "1536Mi"), ("1000", "1k"), ("1500", "1500"), ("1024Mi", "1Gi"),
    ("1.5Ki", "1536"), ("0.1Gi", "107374182400m"), ("2000m", "2"), ("8Gi", "8Gi"), ("0", "0"), ("1e3", "1k"),
])
def test_the_api_server_form_and_the_value_comparison(written, stored):
    assert canonical_quantity(written) == stored
    assert same_quantity(written, stored)


def test_not_quantities_compare_as_they_are():
    assert parse_quantity("lots") is None and not same_quantity("lots", "500m")
    assert not same_quantity("1", "2") and not same_quantity({"a": 1}, "1")
    assert parse_quantity("1.5Gi") == Decimal(3 * 2**29)


suffixes = st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti"])


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=999), suffixes)
def test_the_stored_form_has_the_value_that_was_written(whole, fraction, suffix):
    written = f"{whole}.{fraction:03d}{suffix}" if fraction else f"{whole}{suffix}"
    stored = canonical_quantity(written)
    assert parse_quantity(stored) == parse_quantity(written), (written, stored)  # milli with 3 decimals is still >= nano
    assert canonical_quantity(stored) == stored  # stored once, stored again: the same
