"""``sdplan.frozen`` behaves as ``@dataclass(frozen=True)`` does where the code relies on it."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from sdplan.frozen import asdict, fields, frozen, is_record, replace


@frozen
class Point:
    x: float
    y: float = 0.0


@frozen(kw_only=True)
class Box:
    name: str
    corners: tuple[Point, ...] = ()
    tags: list[str] = dataclasses.field(default_factory=list)


def test_init_takes_positions_keywords_and_defaults() -> None:
    assert Point(1.0) == Point(x=1.0, y=0.0)
    assert Point(1.0, 2.0).y == 2.0
    assert Box(name="b").tags == [] and Box(name="b").tags is not Box(name="b").tags


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Point(), "missing required argument: 'x'"),
    (lambda: Point(1.0, 2.0, 3.0), "takes 2 positional arguments but 3 were given"),
    (lambda: Point(1.0, x=2.0), "multiple values for argument 'x'"),
    (lambda: Point(1.0, z=2.0), "unexpected keyword argument 'z'"),
    (lambda: Box("b"), "takes 0 positional arguments but 1 were given"),
])
def test_init_refuses_what_a_dataclass_refuses(build: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        build()  # type: ignore[operator]


def test_a_field_without_a_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="'b' without a default"):
        @frozen
        class Bad:
            a: int = 1
            b: int


def test_records_are_immutable_values() -> None:
    p = Point(1.0, 2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.x  # type: ignore[misc]
    assert p == Point(1.0, 2.0) and p != Point(1.0, 3.0) and p != (1.0, 2.0)
    assert hash(p) == hash(Point(1.0, 2.0)) and len({p, Point(1.0, 2.0)}) == 1
    assert repr(p) == "Point(x=1.0, y=2.0)"


def test_replace_fields_and_asdict() -> None:
    box = Box(name="b", corners=(Point(1.0), Point(2.0, 3.0)))
    assert fields(Box) == ("name", "corners", "tags") == fields(box)
    assert replace(box, name="c") == Box(name="c", corners=box.corners)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nme'"):
        replace(box, nme="c")
    assert asdict(box) == {"name": "b", "corners": ({"x": 1.0, "y": 0.0}, {"x": 2.0, "y": 3.0}), "tags": []}
    assert is_record(box) and not is_record(Box) and not is_record((1, 2))


def test_copies_and_pickles_round_trip() -> None:
    box = Box(name="b", corners=(Point(1.0),), tags=["t"])
    assert pickle.loads(pickle.dumps(box)) == box
    assert copy.copy(box) == box and copy.deepcopy(box) == box
