"""An input whose values only the app's codec can show: pickled (``lockgate read --app``).

Values are pickled dicts; each is emitted to the output as JSON, unchanged.
"""

import os
from typing import Any

from processors import App, Context
from state.codecs import PICKLE

INPUT = os.environ["LOCKGATE_INPUT_TOPIC"]
OUTPUT = os.environ["LOCKGATE_OUTPUT_TOPIC"]

app = App("pickled")


@app.process(INPUT, value=PICKLE, outputs=[OUTPUT])
def copy(key: str, value: dict[str, Any], ctx: Context) -> None:
    ctx.emit(OUTPUT, key, value)
