"""Field types shared by the model configs, so every family validates them alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

Dropout = Annotated[float, Field(ge=0.0, lt=1.0)]
Activation = Literal["relu", "gelu", "swish", "tanh", "elu"]


def tagged_union(*members: type[BaseModel]) -> Any:
    """A union of configs picked by their ``type`` key.

    pydantic's own message for a bad tag names neither the key nor the choices in a way
    a config author can act on; this one says ``type: expected one of mlp, cnn, got 'x'``.
    """
    tags = [member.model_fields["type"].default for member in members]
    choices = ", ".join(tags)

    def check_tag(value: Any) -> Any:
        if isinstance(value, Mapping):
            if "type" not in value:
                raise ValueError(f"type: required key is missing (one of {choices})")
            if value["type"] not in tags:
                raise ValueError(f"type: expected one of {choices}, got {value['type']!r}")
        return value

    union = members[0]
    for member in members[1:]:
        union = union | member
    return Annotated[union, Field(discriminator="type"), BeforeValidator(check_tag)]
