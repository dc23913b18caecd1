"""Optuna's samplers driven by hpo as Optuna drives them, on the inline engine
(every built-in sampler) and on a real Dask cluster (a few)."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("sampler_conformance")  # its failures explained, as a test module's

from sampler_conformance import CASES, CONSTRAINED, Case, SamplerConformance, SamplerKit, by_name


class InlineKit(SamplerKit):
    def engine(self):
        return {"engine": "inline"}


class TestInline(SamplerConformance):
    @pytest.fixture
    def kit(self):
        return InlineKit()

    @pytest.fixture(params=CASES, ids=str)
    def case(self, request) -> Case:
        return request.param

    @pytest.fixture(params=CONSTRAINED, ids=str)
    def constrained_case(self, request) -> Case:
        return request.param


class DaskKit(SamplerKit):
    parallel = 2  # the shared cluster's two workers

    def __init__(self, address: str) -> None:
        self.address = address

    def engine(self):
        return {"engine": "dask", "scheduler": self.address}


class TestDask(SamplerConformance):
    @pytest.fixture
    def kit(self, dask_address):
        return DaskKit(dask_address)

    @pytest.fixture(params=by_name("tpe-multivariate", "grid"), ids=str)
    def case(self, request) -> Case:
        return request.param

    @pytest.fixture(params=by_name("nsga2"), ids=str)
    def constrained_case(self, request) -> Case:
        return request.param
