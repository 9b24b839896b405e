"""Each sampler's parameters as one typed model (pydantic), defaults and bounds defined once.

A sampler's module declares ``class <Name>Params(SamplerParams)`` with ``name: Literal["<name>"]``
(the discriminator of :data:`prioreplay.priority_server.samplers.SamplerParamsUnion`) and its
parameters, each made by one of the field functions below, so a parameter shared by several
samplers (``probe_size``, the posterior's ``posterior_decay`` and ``posterior_prior``) and the
server's flat setting of the same name (``--alpha``, ``--probe-size``, ... in
:class:`prioreplay.priority_server.config.StoreSettings`) have one default, one bound, one help.

The Redis store sends the model as ONE JSON argument of ``sample.lua`` (``model_dump``, read in Lua
as ``S.<parameter>``); the RPC fuzz draws parameters from the models.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SamplerParams(BaseModel):
    """The parameters of one sampler (a subclass per sampler; this one has none).

    Attributes:
        name: the sampler's registry name, a ``Literal`` in each subclass (the discriminator).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str


def alpha_field() -> Any:
    """``alpha``: exponent of the weighted sampler (priority^alpha)."""
    return Field(1.0, gt=0, le=100, description="exponent of the weighted sampler (priority^alpha)")


def gumbel_temperature_field() -> Any:
    """``gumbel_temperature``: the gumbel sampler's temperature T."""
    return Field(1.0, gt=0, le=100, description="temperature T of the gumbel sampler (formerly --temperature, deprecated)")


def probe_size_field() -> Any:
    """``probe_size``: completions of a screening probe."""
    return Field(2, ge=1, le=1024, description="completions of a screening probe (screened samplers)")


def posterior_decay_field() -> Any:
    """``posterior_decay``: per-step evidence decay of the posterior retests (1: none)."""
    return Field(1.0, gt=0, le=1, description="per-step evidence decay of the posterior retests (1: none)")


def posterior_prior_field() -> Any:
    """``posterior_prior``: the symmetric Beta prior of the posterior retests."""
    return Field(1.0, gt=0, le=1e6, description="symmetric Beta prior α₀ = β₀ of the posterior retests")


def mean_group_size_field() -> Any:
    """``mean_group_size``: Ḡ of the knapsack sampler's token budget."""
    return Field(8, ge=2, le=1024, description="completions per problem the knapsack sampler's token budget buys on average (Ḡ)")


def max_group_size_field() -> Any:
    """``max_group_size``: the knapsack sampler's largest group."""
    return Field(32, ge=2, le=1024, description="largest group the knapsack sampler gives one problem")
