"""The pytest plugin without a broker: broker choice, error messages, registration."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from processors import pytest_plugin as pp
from processors._testing import choice, ports

ROOT = Path(__file__).resolve().parents[2]


def _choose(mode: str | None, image: str | None = None, bootstrap: str | None = None, **kw):  # type: ignore[no-untyped-def]
    present = kw.pop("present", set())
    return pp.choose_broker(
        mode, image, bootstrap, rootdir=kw.pop("rootdir", None), image_present=present.__contains__
    )


def test_choice_external_when_a_bootstrap_is_given() -> None:
    assert _choose(None, bootstrap="127.0.0.1:9") == pp.BrokerChoice(
        "external", bootstrap="127.0.0.1:9"
    )
    assert _choose("external", bootstrap="h:1").mode == "external"
    with pytest.raises(pytest.UsageError, match="LOCKGATE_TEST_BOOTSTRAP"):
        _choose("external")
    with pytest.raises(pytest.UsageError, match="not one of"):
        _choose("zookeeper")


def test_choice_auto_prefers_a_present_official_image_then_a_checkout(tmp_path: Path) -> None:
    assert _choose("auto", present={pp.OFFICIAL_IMAGE}).image == pp.OFFICIAL_IMAGE
    # This package lives in a checkout with docker/build-images.sh: local image.
    local = _choose(None, rootdir=tmp_path)
    assert (local.mode, local.image) == ("local", pp.LOCAL_IMAGE)
    assert local.build_script == ROOT / "docker" / "build-images.sh"


def test_choice_without_checkout_is_the_official_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "_build_script", lambda rootdir: None)
    assert _choose(None) == pp.BrokerChoice("official", image=pp.OFFICIAL_IMAGE)
    assert _choose("local").build_script is None


def test_choice_by_image_name() -> None:
    assert _choose(None, image="lockgate/kafka:mine").mode == "local"
    assert _choose(None, image="apache/kafka:4.0.0").mode == "official"
    assert _choose(None, image="confluentinc/cp-kafka:7.6.0").mode == "confluent"
    assert _choose("official").image == pp.OFFICIAL_IMAGE
    assert _choose("local", image="x/y:z") == pp.BrokerChoice(
        "local", image="x/y:z", build_script=ROOT / "docker" / "build-images.sh"
    )


def test_missing_testcontainers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "testcontainers.core.container", None)
    with pytest.raises(pp.BrokerUnavailableError, match=r"pip install 'lockgate\[testing\]'"):
        pp.start_kafka(pp.BrokerChoice("official", image=pp.OFFICIAL_IMAGE))


def test_app_spec_from_an_app_object() -> None:
    from examples.running_sum import app

    assert pp._find_spec(app) == "examples.running_sum:app"
    assert pp._find_spec("a.b:c") == "a.b:c"
    with pytest.raises(ValueError, match="package.module:app"):
        pp._find_spec("a.b")


def test_app_that_exits_at_start_fails_with_its_log(tmp_path: Path) -> None:
    kafka = pp.LockgateKafka("127.0.0.1:1", "external")  # never contacted: settings fail
    factory = pp.AppFactory(kafka, tmp_path, ROOT)
    with pytest.raises(RuntimeError, match=r"exited with code 2 before it was ready") as err:
        factory("examples.running_sum:app", env={"LOCKGATE_CHECKPOINT_INTERVAL_MS": "-5"})
    assert "LOCKGATE_CHECKPOINT_INTERVAL_MS" in str(err.value)
    assert factory.stop_all() == []


def test_app_that_dies_unnoticed_fails_the_teardown(tmp_path: Path) -> None:
    kafka = pp.LockgateKafka("127.0.0.1:1", "external")
    factory = pp.AppFactory(kafka, tmp_path, ROOT)
    env = {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "-5"}
    run = factory("examples.running_sum:app", env=env, wait_ready=False)
    run_proc = run.proc  # type: ignore[attr-defined]
    run_proc.wait(60)
    problems = factory.stop_all()
    assert len(problems) == 1 and "exited by itself with code 2" in problems[0], problems


def test_plugin_is_registered_and_harmless_without_testcontainers(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            def test_plain():
                assert True

            def test_needs_broker(lockgate_kafka):
                pass
            """
        )
    )
    runner = (
        "import sys; sys.modules['testcontainers'] = None; import pytest; "
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--lockgate-kafka=official', "
        f"{str(tmp_path)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", runner],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout + done.stderr
    assert "1 passed" in out and ("1 error" in out or "1 failed" in out), out
    assert "pip install 'lockgate[testing]'" in out, out


def test_readme_example_is_the_tested_one() -> None:
    readme = (ROOT / "README.md").read_text()
    head = "def test_running_sum(lockgate_kafka, lockgate_topics, lockgate_app):\n"
    snippet = readme.split("```python\n" + head, 1)[1].split("```", 1)[0]
    assert len(snippet.splitlines()) + 1 <= 10
    tested = (ROOT / "tests" / "containers" / "test_pytest_plugin.py").read_text()
    body = tested.split("verbatim (checked below).\n", 1)[1].split("\n\n", 1)[0]
    assert body.strip() == snippet.strip()


def test_free_port_skips_bound_and_handed_out_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setattr(ports, "_handed_out", set())
    for _ in range(50):  # a bound port whose two successors are free
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        if all(pp._port_free(held.getsockname()[1] + i) for i in (1, 2)):
            break
        held.close()
    try:
        taken = held.getsockname()[1]
        # a range of three ports, the first bound by another process: the other two, each once
        spec = f"{taken}-{taken + 2}"
        first = pp.free_port(ports=spec)
        second = pp.free_port(ports=spec)
        assert {first, second} == {taken + 1, taken + 2}
        # used up: a port handed out before comes back (it is still free), never the bound one
        assert pp.free_port(ports=spec) in {taken + 1, taken + 2}
        with pytest.raises(pp.BrokerUnavailableError):
            pp.free_port(ports=f"{taken}-{taken}")
    finally:
        held.close()
