"""examples/click_pipeline.py under the in-process TestDriver: both apps, chained by hand."""

from collections import Counter

from examples import click_pipeline
from examples.click_pipeline import click_app, region_app
from processors.testing import Emitted, TestDriver

CLICKS = [
    ("ann", "eu", 0),
    ("bob", "us", 1),
    ("ann", "eu", 2),
    ("cid", "eu", 3),
    ("bob", "us", 4),
    ("ann", "eu", 5),
    ("dee", "apac", 6),
]


def _run_clicks(driver: TestDriver) -> list[Emitted]:
    out: list[Emitted] = []
    for i, (user, region, seq) in enumerate(CLICKS):
        emitted = driver.send(user, {"region": region, "seq": seq})
        assert len(emitted) == 1, emitted  # exactly one record per click
        out += emitted
        if i == 3:
            driver.commit()
    driver.commit()
    return out


def test_click_app_counts_per_user_and_keys_by_region() -> None:
    d = TestDriver(click_app)
    out = _run_clicks(d)
    assert all(e.topic == click_pipeline.USER_COUNTS for e in out)
    assert [(e.key, e.value) for e in out] == [
        ("eu", {"user": "ann", "count": 1, "seq": 0}),
        ("us", {"user": "bob", "count": 1, "seq": 1}),
        ("eu", {"user": "ann", "count": 2, "seq": 2}),
        ("eu", {"user": "cid", "count": 1, "seq": 3}),
        ("us", {"user": "bob", "count": 2, "seq": 4}),
        ("eu", {"user": "ann", "count": 3, "seq": 5}),
        ("apac", {"user": "dee", "count": 1, "seq": 6}),
    ]
    assert d.state("user-clicks", "ann") == 3
    assert d.state("user-clicks", "dee") == 1
    assert click_app.outputs[click_pipeline.USER_COUNTS].internal


def test_region_app_totals_the_click_app_output() -> None:
    counts = _run_clicks(TestDriver(click_app))
    d = TestDriver(region_app)
    totals = []
    for e in counts:
        [t] = d.send(e.key, e.value)
        assert t.topic == click_pipeline.OUTPUT
        totals.append((t.key, t.value))
    assert totals == [
        ("eu", {"total": 1}),
        ("us", {"total": 1}),
        ("eu", {"total": 2}),
        ("eu", {"total": 3}),
        ("us", {"total": 2}),
        ("eu", {"total": 4}),
        ("apac", {"total": 1}),
    ]
    d.commit()
    per_region = Counter(region for _, region, _ in CLICKS)
    assert {r: d.state("region-clicks", r) for r in per_region} == dict(per_region)


def test_a_crash_loses_only_the_open_epoch_of_each_app() -> None:
    clicks = TestDriver(click_app)
    clicks.send("ann", {"region": "eu", "seq": 0})
    clicks.commit()
    clicks.send("ann", {"region": "eu", "seq": 1})
    clicks.crash()  # seq 1 was not committed: it is processed again, counted once
    [again] = clicks.send("ann", {"region": "eu", "seq": 1})
    assert again.value == {"user": "ann", "count": 2, "seq": 1}
    clicks.commit()
    assert [e.value["count"] for e in clicks.emitted] == [1, 2]

    regions = TestDriver(region_app)
    regions.send("eu", clicks.emitted[0].value)
    regions.commit()
    regions.send("eu", clicks.emitted[1].value)
    regions.crash()
    [total] = regions.send("eu", clicks.emitted[1].value)
    assert total.value == {"total": 2}
