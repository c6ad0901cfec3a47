"""Clicks per user, then clicks per region: two lockgate apps chained through a topic.

``click_app`` (app name ``click-counts``) reads ``LOCKGATE_CLICKS_TOPIC`` (default
``clicks``): key = user id (UTF-8), value = ``{"region": <str>, "seq": <int>}``. It counts
the clicks of each user (keyed value state) and for every click emits exactly one record to
the internal topic ``LOCKGATE_USER_COUNTS_TOPIC`` (default ``user-counts``, declared
``internal=True``: the runtime writes barrier records to it at every epoch end), key =
region, value ``{"user": <str>, "count": <clicks of that user so far>, "seq": <input seq>}``.

``region_app`` (app name ``region-totals``) reads that topic and for every record emits
exactly one record to ``LOCKGATE_OUTPUT_TOPIC`` (default ``region-totals``), key = region,
value ``{"total": <clicks of that region so far>}``.

Each app runs in its own process(es); ``LOCKGATE_APP_NAME`` renames either one, and
``LOCKGATE_ALIGNMENT`` (``aligned`` or ``none``) picks how ``region_app`` checkpoints
across the two apps. Both apps read the three topic variables at import time and both
accept all three, so one environment can serve both processes::

    export LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092
    lockgate run examples.click_pipeline:click_app
    lockgate run examples.click_pipeline:region_app

Create the user-counts topic before starting ``region_app`` (or start ``click_app`` first:
it creates its outputs with the input's partition count).
"""

import os
from typing import Any

from processors import App, Context, OutputSpec
from state import ValueState

CLICKS = os.environ.get("LOCKGATE_CLICKS_TOPIC", "clicks")
USER_COUNTS = os.environ.get("LOCKGATE_USER_COUNTS_TOPIC", "user-counts")
OUTPUT = os.environ.get("LOCKGATE_OUTPUT_TOPIC", "region-totals")

click_app = App(
    "click-counts",
    env=["LOCKGATE_CLICKS_TOPIC", "LOCKGATE_USER_COUNTS_TOPIC", "LOCKGATE_OUTPUT_TOPIC"],
)
user_clicks: ValueState[int] = click_app.value_state("user-clicks")


@click_app.process(CLICKS, outputs=[OutputSpec(USER_COUNTS, internal=True)])
def count_user(user: str, click: dict[str, Any], ctx: Context) -> None:
    count = (user_clicks.value() or 0) + 1
    user_clicks.update(count)
    ctx.emit(USER_COUNTS, click["region"], {"user": user, "count": count, "seq": click["seq"]})


region_app = App(
    "region-totals",
    env=["LOCKGATE_CLICKS_TOPIC", "LOCKGATE_USER_COUNTS_TOPIC", "LOCKGATE_OUTPUT_TOPIC"],
)
region_clicks: ValueState[int] = region_app.value_state("region-clicks")


@region_app.process(USER_COUNTS, outputs=[OUTPUT])
def total_region(region: str, _count: dict[str, Any], ctx: Context) -> None:
    total = (region_clicks.value() or 0) + 1
    region_clicks.update(total)
    ctx.emit(OUTPUT, region, {"total": total})
