"""`validation_problems`: one way every typed input (router config, membership, policy tunables, deployment flags)
names its bad fields."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from zoe_cluster.config_errors import validation_problems


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: int = Field(ge=1)


class Outer(BaseModel):
    inner: Inner
    names: list[str]


def _error(model, data) -> ValidationError:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as e:
        model.model_validate(data)
    return e.value


def test_every_problem_is_named_by_its_dotted_field_path():
    text = validation_problems(_error(Outer, {"inner": {"port": 0, "bogus": 1}, "names": ["a", 3]}))
    assert text.split("; ") == ["inner.port: Input should be greater than or equal to 1",
                                "inner.bogus: Extra inputs are not permitted",
                                "names.1: Input should be a valid string"]


def test_a_problem_of_the_whole_input_and_a_prefix():
    whole = _error(RootModel[int], "x")
    assert validation_problems(whole, whole="body") == "body: Input should be a valid integer, unable to parse string as an integer"
    assert validation_problems(_error(Inner, {"port": 0}), prefix="router: ").startswith("router: port: ")
