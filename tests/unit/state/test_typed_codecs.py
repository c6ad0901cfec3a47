"""Typed codecs: pydantic models (Model) and faust.Record classes (FaustRecord)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from processors import App
from state.codecs import JSON, Codec, DecodeError, FaustRecord, Model
from state.savepoint import SavepointError, SavepointStore, check_compatible

ROOT = Path(__file__).resolve().parents[3]


class Item(BaseModel):
    sku: str
    price: Decimal


class Order(BaseModel):
    id: str
    qty: int
    placed: dt.datetime
    items: list[Item] = []
    customer: str = Field(default="", alias="customerId")


ORDER = Order(
    id="o1",
    qty=3,
    placed=dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    items=[Item(sku="a", price=Decimal("1.10"))],
    customerId="c9",
)


# ------------------------------------------------------------------ pydantic


def test_model_round_trip_keeps_types_and_aliases() -> None:
    codec = Model(Order)
    assert isinstance(codec, Codec)
    data = codec.encode(ORDER)
    assert b'"customerId":"c9"' in data  # by alias: what model_validate_json reads
    back = codec.decode(data)
    assert back == ORDER and isinstance(back, Order)
    assert back.items[0].price == Decimal("1.10")


def test_model_encodes_a_dict_of_fields_after_validating_it() -> None:
    codec = Model(Order)
    fields = {"id": "o2", "qty": "4", "placed": "2025-01-02T03:04:05Z"}
    assert codec.decode(codec.encode(fields)).qty == 4
    with pytest.raises(ValueError, match=r"Order\.qty: Input should be a valid integer"):
        codec.encode({**fields, "qty": "x"})
    with pytest.raises(TypeError, match="encodes Order instances"):
        codec.encode(["not", "an", "order"])  # type: ignore[arg-type]


def test_model_refuses_to_write_what_it_could_not_read_back() -> None:
    broken = Order.model_construct(id="o3", qty="x", placed=ORDER.placed)
    with pytest.raises(ValueError, match="Order cannot be encoded.*qty"):
        Model(Order).encode(broken)


def test_validation_errors_name_the_field_and_the_input() -> None:
    codec = Model(Order)
    with pytest.raises(DecodeError) as err:
        codec.decode(b'{"id": "o1", "qty": "x", "placed": "2025-01-02T03:04:05Z"}')
    msg = str(err.value)
    assert msg.startswith("Order.qty: Input should be a valid integer"), msg
    assert msg.endswith("(got 'x')"), msg
    with pytest.raises(DecodeError) as err:
        codec.decode(b'{"qty": 1, "placed": "2025-01-02T03:04:05Z", "items": [{"sku": "a"}]}')
    assert str(err.value) == "Order.id: Field required; Order.items.0.price: Field required"


@pytest.mark.parametrize(
    ("data", "start"),
    [(b"{not json", "Order: Invalid JSON"), (b"[1]", "Order: Input should be an object")],
)
def test_undecodable_documents_are_decode_errors(data: bytes, start: str) -> None:
    with pytest.raises(DecodeError, match=f"^{start}"):
        Model(Order).decode(data)


def test_many_errors_are_counted_and_long_inputs_cut() -> None:
    class Wide(BaseModel):
        a: int
        b: int
        c: int
        d: int
        e: int
        f: int
        g: int

    doc = '{"a": "%s", "b": "x", "c": "x", "d": "x", "e": "x", "f": "x", "g": "x"}' % ("y" * 500)
    with pytest.raises(DecodeError) as err:
        Model(Wide).decode(doc.encode())
    msg = str(err.value)
    assert msg.endswith("(+2 more errors)") and len(msg) < 1000, msg
    assert "Wide.a:" in msg and "Wide.f:" not in msg


def test_model_names_are_stable_and_overridable() -> None:
    assert Model(Order).name == f"pydantic:{__name__}.Order"
    assert Model(Order).name == Model(Order).name  # a new instance, the same name
    assert Model(Order, name="shop.Order").name == "pydantic:shop.Order"
    assert repr(Model(Order, name="shop.Order")) == "Model(Order, name='pydantic:shop.Order')"
    with pytest.raises(ValueError, match="without spaces"):
        Model(Order, name="shop Order")


def test_model_refuses_other_classes() -> None:
    with pytest.raises(TypeError, match="pydantic BaseModel subclass"):
        Model(dict)  # type: ignore[type-var]
    with pytest.raises(TypeError, match=r"use FaustRecord\(cls\)"):
        Model(DuckRecord)  # type: ignore[type-var]


# ------------------------------------------------------------------ savepoints


def _schemas(app: App) -> dict[str, dict[str, str]]:
    """Store name -> kind and codec, as the runtime saves them in a savepoint."""
    return {n: {"kind": h.spec.kind, "codec": h.spec.codec.name} for n, h in app.stores.items()}


def _app(codec: Codec) -> App:
    app = App("typed")
    app.value_state("orders", codec=codec)
    return app


def test_a_savepoint_of_a_model_store_restores_into_a_new_process(tmp_path: Path) -> None:
    """The codec name goes through the manifest JSON and matches a fresh Model(Order)."""
    store = SavepointStore(str(tmp_path))
    sp = "sp-20250102T030405Z-a1b2c3"
    codec = Model(Order)
    sf = store.write_store(sp, "typed", 0, "orders", [(b"o1", codec.encode(ORDER))])
    store.write_manifest(
        sp, "typed", 0, {"stores": {"orders": {**_schemas(_app(codec))["orders"], **sf.to_dict()}}}
    )
    saved = store.read_manifest(sp, "typed", 0)["stores"]
    restarted = _app(Model(Order))  # a new codec instance, as after a restart
    assert check_compatible(saved, _schemas(restarted), allow_non_restored=False) == ["orders"]
    [(key, value)] = list(store.read_store(sp, "typed", 0, "orders", sf))
    assert Model(Order).decode(value) == ORDER


def test_a_model_store_does_not_restore_under_another_codec() -> None:
    saved = _schemas(_app(Model(Order)))
    for other in (JSON, Model(Item), Model(Order, name="shop.Order")):
        with pytest.raises(SavepointError, match=r"saved as value/pydantic:.*Order"):
            check_compatible(saved, _schemas(_app(other)), allow_non_restored=False)
    # A class moved to another module keeps restoring when it keeps its name.
    pinned = _schemas(_app(Model(Order, name="shop.Order")))
    moved = type("Order", (Order,), {"__module__": "shop.models"})
    assert check_compatible(pinned, _schemas(_app(Model(moved, name="shop.Order"))), False)


# ------------------------------------------------------------------ faust


class DuckRecord:
    """Exactly faust's documented model API that FaustRecord relies on."""

    def __init__(self, id: str, qty: int) -> None:  # noqa: A002 - a field name
        if not isinstance(qty, int):
            raise ValueError(f"qty must be an int, got {qty!r}")
        self.id, self.qty = id, qty

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DuckRecord) and (self.id, self.qty) == (other.id, other.qty)

    __hash__ = None  # type: ignore[assignment]

    def to_representation(self) -> dict[str, Any]:
        return {"id": self.id, "qty": self.qty, "__faust": {"ns": "t.DuckRecord"}}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> DuckRecord:
        fields = {k: v for k, v in data.items() if k != "__faust"}
        return cls(**fields)


def test_faust_record_round_trip_by_duck_typing() -> None:
    codec = FaustRecord(DuckRecord)
    assert isinstance(codec, Codec)
    assert codec.name == f"faust:{__name__}.DuckRecord"
    assert FaustRecord(DuckRecord, name="shop.Order").name == "faust:shop.Order"
    rec = DuckRecord("o1", 2)
    data = codec.encode(rec)
    assert data == b'{"id":"o1","qty":2,"__faust":{"ns":"t.DuckRecord"}}'
    assert codec.decode(data) == rec


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"id": "o1", "qty": "x"}', "^DuckRecord: ValueError: qty must be an int, got 'x'$"),
        (b'{"id": "o1"}', "^DuckRecord: TypeError: .*qty"),
        (b"[1]", "^DuckRecord: expected a JSON object, got list$"),
        (b"{", "^DuckRecord: invalid JSON"),
    ],
)
def test_faust_record_refusals_are_decode_errors(data: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        FaustRecord(DuckRecord).decode(data)


def test_faust_record_names_a_field_faust_reports() -> None:
    class FieldError(ValueError):
        field = type("Descriptor", (), {"field": "qty"})()

    class Strict(DuckRecord):
        @classmethod
        def from_data(cls, data: dict[str, Any]) -> DuckRecord:
            raise FieldError("must be positive")

    with pytest.raises(DecodeError, match=r"^Strict\.qty: FieldError: must be positive$"):
        FaustRecord(Strict).decode(b"{}")


def test_faust_record_refuses_other_classes_and_values() -> None:
    with pytest.raises(TypeError, match="needs a faust.Record class"):
        FaustRecord(Order)
    with pytest.raises(TypeError, match="encodes DuckRecord records, got dict"):
        FaustRecord(DuckRecord).encode({"id": "o1"})


_FAUST_SCRIPT = """
import sys
from decimal import Decimal

import faust

sys.path[len(sys.path):] = sys.argv[1:]  # lockgate and its dependencies, after faust's
from state.codecs import DecodeError, FaustRecord


class Item(faust.Record, coerce=True):
    sku: str
    price: Decimal


class Order(faust.Record, validation=True, coerce=True):
    id: str
    qty: int
    items: list[Item]


codec = FaustRecord(Order)
order = Order(id="o1", qty=2, items=[Item(sku="a", price=Decimal("1.10"))])
ours = codec.encode(order)
theirs = faust.serializers.codecs.dumps("json", order)
assert codec.decode(theirs) == order, (codec.decode(theirs), order)
assert Order.loads(ours, serializer="json") == order, ours
assert codec.decode(ours).items[0].price == Decimal("1.10")
try:
    codec.decode(b'{"id": "o1", "qty": "x", "items": []}')
except DecodeError as exc:
    print("refused:", exc)
else:
    raise AssertionError("qty='x' was accepted")
print("ok", codec.name)
"""


@pytest.mark.skipif(
    not os.environ.get("LOCKGATE_TEST_FAUST_PYTHON"),
    reason="LOCKGATE_TEST_FAUST_PYTHON (a python with faust-streaming, never this venv) not set",
)
def test_faust_record_with_real_faust_streaming() -> None:
    """Runs faust-streaming in its own interpreter: it pins dependencies lockgate cannot."""
    site = [p for p in sys.path if p.endswith("site-packages")]
    out = subprocess.run(  # noqa: S603 - the interpreter the developer named
        [
            os.environ["LOCKGATE_TEST_FAUST_PYTHON"],
            "-c",
            textwrap.dedent(_FAUST_SCRIPT),
            str(ROOT),
            *site,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused: Order" in out.stdout and "ok faust:__main__.Order" in out.stdout, out.stdout
