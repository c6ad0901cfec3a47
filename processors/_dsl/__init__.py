"""The app-definition language: :class:`App`, streams, outputs, topics, the record context.

What user code touches to declare an app (re-exported by :mod:`processors`): ``app``
(App, Stream, operators), ``context`` (Context), ``record`` (the record view),
``partitioner`` (Kafka's murmur2 key -> key group), ``topics`` (OutputSpec, TopicConfig,
topic creation and checks). Imports nothing of the runtime.
"""
