"""An app with two input topics (refused when the module is imported)."""

from processors import App

app = App("bad")
app.stream("a", "b").to("out")
