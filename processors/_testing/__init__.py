"""The parts of lockgate's pytest plugin (the entry module is :mod:`processors.pytest_plugin`).

Private: users import from ``processors.pytest_plugin``, which pytest loads (entry point
``pytest11``) and which re-exports the names. By concern:

* :mod:`.choice`: which broker ``lockgate_kafka`` provides (modes, images, options' env).
* :mod:`.ports`: host ports for host-network containers and app HTTP servers.
* :mod:`.containers`: Docker and testcontainers: engine, image builds, containers' life.
* :mod:`.broker`: the running broker (:class:`LockgateKafka`, its clients) and its start.
* :mod:`.topics`: topics unique to a test (:class:`TopicFactory`).
* :mod:`.apps`: apps run against the broker (:class:`AppFactory`, :class:`AppRun`).
"""
