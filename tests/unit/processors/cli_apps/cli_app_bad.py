"""An app that declares the same input topic twice (refused when the module is imported)."""

from processors import App

app = App("bad")
app.stream("a").to("out")
app.stream("a").to("out2")
