"""Each sampler's parameters as one typed model (pydantic), defaults and bounds defined once.

A sampler's module declares ``class <Name>Params(SamplerParams)`` with ``name: Literal["<name>"]``
(the sampler's name: ``sampler={"name": ..., <parameter>: ...}`` is a setting) and its
parameters, each made by one of the field functions below, so a parameter shared by several
samplers (``probe_size``, the posterior's ``posterior_decay`` and ``posterior_prior``) and the
server's flat setting of the same name (``--alpha``, ``--probe-size``, ... in
:class:`prioreplay.priority_server.config.StoreSettings`) have one default, one bound, one help.

The Redis store sends the model as ONE JSON argument of ``sample.lua`` (``model_dump``, read in Lua
as ``S.<parameter>``); the RPC fuzz draws parameters from the models.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SamplerParams(BaseModel):
    """The parameters of one sampler (a subclass per sampler; this one has none).

    Attributes:
        name: the sampler's registry name, a ``Literal`` in each subclass (the discriminator).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str


class ProbeParams(SamplerParams):
    """The parameters of a sampler that probes (``probe_size``): what :class:`.base.RetestThenHeap`'s
    probes read. A sampler's model inherits it to have them."""

    probe_size: int = Field(2, ge=1, le=1024, description="completions of a screening probe (screened samplers)")


class PosteriorRetestParams(SamplerParams):
    """The parameters of the posterior retests (``posterior_decay``, ``posterior_prior``): what
    :class:`.posterior.PosteriorSampler` and :class:`.thompson.ThompsonSampler` read."""

    posterior_decay: float = Field(1.0, gt=0, le=1, description="per-step evidence decay of the posterior retests (1: none)")
    posterior_prior: float = Field(1.0, gt=0, le=1e6, description="symmetric Beta prior α₀ = β₀ of the posterior retests")


def alpha_field() -> Any:
    """``alpha``: exponent of the weighted sampler (priority^alpha)."""
    return Field(1.0, gt=0, le=100, description="exponent of the weighted sampler (priority^alpha)")


def gumbel_temperature_field() -> Any:
    """``gumbel_temperature``: the gumbel sampler's temperature T."""
    return Field(1.0, gt=0, le=100, description="temperature T of the gumbel sampler (formerly --temperature, deprecated)")


def probe_size_field() -> Any:
    """``probe_size``: completions of a screening probe (:class:`ProbeParams`'s field)."""
    return _copy(ProbeParams, "probe_size")


def posterior_decay_field() -> Any:
    """``posterior_decay``: per-step evidence decay of the posterior retests (:class:`PosteriorRetestParams`'s field)."""
    return _copy(PosteriorRetestParams, "posterior_decay")


def posterior_prior_field() -> Any:
    """``posterior_prior``: the symmetric Beta prior of the posterior retests (:class:`PosteriorRetestParams`'s field)."""
    return _copy(PosteriorRetestParams, "posterior_prior")


def mean_group_size_field() -> Any:
    """``mean_group_size``: Ḡ of the knapsack sampler's token budget."""
    return Field(8, ge=2, le=1024, description="completions per problem the knapsack sampler's token budget buys on average (Ḡ)")


def max_group_size_field() -> Any:
    """``max_group_size``: the knapsack sampler's largest group."""
    return Field(32, ge=2, le=1024, description="largest group the knapsack sampler gives one problem")


def _copy(model: type[BaseModel], name: str) -> Any:
    """A fresh copy of ``model``'s field ``name`` (default, bounds, help), to declare it on another model."""
    return copy.deepcopy(model.model_fields[name])
