"""The sampler's setting: which sampler, and its parameters (``--sampler``, ``--alpha``, ...).

One concept, one model: :class:`SamplerSettings` is composed into
:class:`prioreplay.priority_server.config.StoreSettings` (so into the server's flags and what the
stores take). The sampler's parameters are its registry row's model
(:mod:`prioreplay.priority_server.samplers.params`); the flat flags here are aliases of that model's
fields, and the sampler may be given nested instead (``sampler={"name": "weighted", "alpha": 2}``).

Imports only pydantic, the standard library and the sampler registry, so ``--help`` stays fast.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from .samplers import DEFAULT_SAMPLER, SAMPLER_HELP, SAMPLERS, SamplerName, SamplerParams
from .samplers.params import (
    alpha_field,
    gumbel_temperature_field,
    max_group_size_field,
    mean_group_size_field,
    posterior_decay_field,
    posterior_prior_field,
    probe_size_field,
)

#: Store settings renamed, old name -> new: the old flag, environment variable, config-file key
#: (:attr:`prioreplay.priority_server.config.ServerConfig.renamed`) and the old name of a stored run setting
#: (:data:`prioreplay.priority_server.store.contract.RENAMED_RUN_SETTINGS`) are still read, under the new name.
RENAMED_STORE_SETTINGS: dict[str, str] = {"temperature": "gumbel_temperature"}


class SamplerSettings(BaseModel):
    """The sampler and its parameters, declared once (composed into ``StoreSettings``).

    Raises (at construction):
        pydantic.ValidationError: an unregistered sampler, a parameter out of its model's bounds, a
            ``sampler_args`` key the model lacks, or one parameter given two ways with two values.
    """

    sampler: SamplerName = Field(DEFAULT_SAMPLER, description=SAMPLER_HELP)
    # each sampler's parameters, flat (``--alpha``, ...): the fields of its model (samplers.params:
    # defaults, bounds and help defined there once); :attr:`sampler_params` is the chosen one's model
    alpha: float = alpha_field()
    gumbel_temperature: float = gumbel_temperature_field()
    probe_size: int = probe_size_field()
    posterior_decay: float = posterior_decay_field()
    posterior_prior: float = posterior_prior_field()
    mean_group_size: int = mean_group_size_field()
    max_group_size: int = max_group_size_field()
    sampler_args: str = Field(
        "",
        description="the sampler's parameters that have no flag of their own, as a JSON object (e.g. a sampler "
        "added later; docs/SAMPLERS.md); checked against the sampler's parameter model",
    )

    @model_validator(mode="before")
    @classmethod
    def _nested_sampler(cls, values: Any) -> Any:
        # The sampler as one nested setting: ``sampler: {name: weighted, alpha: 2}`` (a config file,
        # PRIOREPLAY_SAMPLER as JSON, a dict or a SamplerParams model in Python), split into the name,
        # the flat settings it aliases (--alpha, ...) and sampler_args for parameters without a flag.
        if not isinstance(values, dict):
            return values
        sampler = values.get("sampler")
        if isinstance(sampler, str) and sampler.lstrip().startswith("{"):
            sampler = json.loads(sampler)
        if isinstance(sampler, SamplerParams):
            sampler = sampler.model_dump()
        if not isinstance(sampler, dict):
            return values
        given = dict(sampler)
        if not isinstance(given.get("name"), str):
            raise ValueError(f"sampler ({sampler!r}) as a nested setting needs its name: {{'name': 'weighted', 'alpha': 2}}")
        out = {**values, "sampler": given.pop("name")}
        flat = {
            k: given.pop(k) for k in list(given) if k in SamplerSettings.model_fields and k not in ("sampler", "sampler_args")
        }
        for key, value in flat.items():
            if key in values and values[key] != value:
                raise ValueError(
                    f"{key} is given twice, {values[key]!r} as a setting and {value!r} in sampler ({sampler!r}); give it once"
                )
            out[key] = value
        if given:
            earlier = values.get("sampler_args") or {}
            earlier = json.loads(earlier) if isinstance(earlier, str) else dict(earlier)
            out["sampler_args"] = {**earlier, **given}
        return out

    @field_validator("sampler", mode="wrap")
    @classmethod
    def _check_sampler(cls, v: object, handler: ValidatorFunctionWrapHandler) -> str:
        # The registry at validation time, not the Literal frozen at import: a sampler registered
        # later (a plugin, a test) is accepted; the annotation still lists the names for --help.
        if isinstance(v, str) and v in SAMPLERS:
            return v
        raise ValueError(f"sampler ({v!r}) must be one of {', '.join(SAMPLERS)}")

    @property
    def sampler_params(self) -> SamplerParams:
        """The chosen sampler's parameters, the one model its sampler is given: its registry row's
        model (``SAMPLERS[sampler].params``, looked up at validation time so a sampler registered
        later is accepted) filled from the flat fields of the same names (a parameter no flat field
        has keeps the model's default), then ``sampler_args``. The sampler may also be given nested,
        ``sampler={"name": "weighted", "alpha": 2}`` (a config file's ``sampler:`` mapping, a JSON
        ``PRIOREPLAY_SAMPLER``): the flat fields are its aliases.

        Raises:
            pydantic.ValidationError: a value out of the model's bounds, or a ``sampler_args`` key the
                model does not have (checked at construction, :meth:`_check_sampler_args`).
        """
        model = SAMPLERS[self.sampler].params
        values = {f: getattr(self, f) for f in model.model_fields if f != "name" and f in type(self).model_fields}
        return model(**{**values, **json.loads(self.sampler_args or "{}"), "name": self.sampler})

    @field_validator("sampler_args", mode="before")
    @classmethod
    def _json_object(cls, v: object) -> object:
        # a dict (Python callers) is kept as its canonical JSON text: the settings stay hashable
        if isinstance(v, dict):
            return json.dumps(v, sort_keys=True)
        if isinstance(v, str) and v.strip():
            args = json.loads(v)
            if not isinstance(args, dict):
                raise ValueError(f"sampler_args ({v!r}) must be a JSON object such as '{{\"skip\": 2}}'")
            flagged = sorted(set(args) & set(cls.model_fields))
            if flagged:  # one place per value: the memory samplers read the flat fields
                flag = flagged[0].replace("_", "-")
                raise ValueError(f"sampler_args ({v!r}) sets {flagged}: use their own settings (--{flag})")
        return v

    @model_validator(mode="after")
    def _check_sampler_args(self) -> SamplerSettings:
        self.sampler_params  # noqa: B018 - validates sampler_args against the sampler's model
        return self

    @model_validator(mode="after")
    def _check_group_sizes(self) -> SamplerSettings:
        if self.max_group_size < self.mean_group_size:
            raise ValueError(
                f"max_group_size ({self.max_group_size}) must be >= mean_group_size ({self.mean_group_size}); "
                "raise --max-group-size or lower --mean-group-size"
            )
        return self


#: The flat sampler settings (``--alpha``, ``--probe-size``, ...): the fields of :class:`SamplerSettings`
#: that a registered sampler's parameter model has, so each is an alias of that model's field.
SAMPLER_FLAGS: tuple[str, ...] = tuple(
    name
    for name in SamplerSettings.model_fields
    if any(name in s.params.model_fields for s in SAMPLERS.values()) and name != "name"
)
