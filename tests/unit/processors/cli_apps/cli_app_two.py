"""Two apps; `first` reads LOCKGATE_WINDOW_MS, `second` has a stream without operators."""

from processors import App

first = App("first", env=["LOCKGATE_WINDOW_MS"])
first.stream("in").to("out")

second = App("second")
second.stream("in")
