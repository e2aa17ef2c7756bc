"""The one config codec: typed values from plain data, errors that name the dotted key, and back."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from storage.io.codec import ConfigError, decode, encode


@dataclass(frozen=True, kw_only=True)
class Inner:
    width: int = 4
    names: tuple[str, ...] = ()
    ratio: float = 0.5

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"inner.width must be >= 1, got {self.width}")


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str = "x"
    flag: bool = False
    tag: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)


def test_missing_keys_take_defaults_and_lists_become_tuples():
    got = decode(Outer, {"inner": {"names": ["a", "b"], "ratio": 1}, "env": {"K": "v"}})
    assert got == Outer(inner=Inner(names=("a", "b"), ratio=1.0), env={"K": "v"})
    assert isinstance(got.inner.ratio, float)
    assert decode(Outer, None) == Outer()


def test_encode_and_decode_are_inverse():
    value = Outer(name="n", flag=True, tag="t", env={"A": "1"}, inner=Inner(width=9, names=("z",)))
    assert decode(Outer, encode(value)) == value


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"inner": {"widht": 3}}, r"unknown config key spec\.inner\.widht"),
        ({"flag": "yes"}, r"spec\.flag must be true or false"),
        ({"inner": {"width": "wide"}}, r"spec\.inner\.width must be an integer"),
        ({"inner": {"names": "a"}}, r"spec\.inner\.names must be a list"),
        ({"env": ["x"]}, r"spec\.env must be a mapping"),
        ({"inner": 3}, r"spec\.inner must be a mapping"),
        ({"inner": {"width": 0}}, r"inner\.width must be >= 1, got 0"),
    ],
)
def test_bad_data_raises_naming_the_dotted_key(data, names):
    with pytest.raises(ConfigError, match=names):
        decode(Outer, data, prefix="spec.")


def test_ignore_mode_skips_unknown_keys_at_every_depth_and_keeps_type_checks():
    data = {"name": "n", "retired": 1, "inner": {"width": 3, "gone": [1], "names": ["a"]}}
    assert decode(Outer, data, unknown="ignore") == Outer(name="n", inner=Inner(width=3, names=("a",)))
    with pytest.raises(ConfigError, match=r"unknown config key spec\.retired"):
        decode(Outer, data, prefix="spec.")  # what a user writes stays strict
    with pytest.raises(ConfigError, match=r"spec\.inner\.width must be an integer"):
        decode(Outer, {"inner": {"width": "wide", "gone": 1}}, prefix="spec.", unknown="ignore")


@dataclass(frozen=True, kw_only=True)
class Needs:
    size: int


def test_a_missing_required_key_is_named():
    with pytest.raises(ConfigError, match=r"rec: size is missing \(a required key of Needs\)"):
        decode(Needs, {"other": 1}, prefix="rec: ", unknown="ignore")
