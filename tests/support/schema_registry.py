"""A real schema registry for the tests: Apicurio Registry with its Confluent-compatible API.

Apicurio Registry (Apache-2.0) is published to Maven Central as the thin jars of a
Quarkus app, so the Maven project in ``tests/support/apicurio/`` builds the runnable app
from them (``quarkus-maven-plugin build``) once, under
``.cache/schema-registry/apicurio-<v>/`` (rebuilt when a file of that project changes).
Central lacks two pieces, which the project replaces: JitPack's everit-json-schema (the
same library from Central) and the ``-deployment`` jar of Apicurio's config-index
extension (a bean producing the empty list of dynamic properties it would have built).
It runs with its in-memory storage (H2 in memory: no Kafka topic, no database server),
on 127.0.0.1 and a free port; the Confluent Schema Registry API is served at
``/apis/ccompat/v7``, which confluent-kafka's ``SchemaRegistryClient`` talks to.

Why not Karapace: it is not published on PyPI (``pip install karapace`` finds nothing).
Why 2.4.2.Final: the 3.x jars target Java 21 (this machine has Java 17), and 2.6.x
needs ``apicurio-registry-schema-util-provider`` versions that Maven Central lacks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
VERSION = "2.4.2.Final"
PROJECT = Path(__file__).resolve().parent / "apicurio"
CACHE = ROOT / ".cache" / "schema-registry" / f"apicurio-{VERSION}"
CCOMPAT = "/apis/ccompat/v7"


class RegistryUnavailable(RuntimeError):
    """Java or Maven is missing, or the registry could not be built or started."""


def ensure_built(timeout: float = 1500) -> Path:
    """Build the registry app once (cached); return its runner jar.

    Raises:
        RegistryUnavailable: ``java`` or ``mvn`` is not installed, or the build failed
            (the message ends with the build log's tail).
    """
    jar = CACHE / "target" / f"lockgate-schema-registry-{VERSION}-runner.jar"
    stamp = CACHE / ".inputs"
    files = sorted(p for p in PROJECT.rglob("*") if p.is_file())
    want = "".join(f"{p.relative_to(PROJECT)}\n{p.read_text()}\n" for p in files)
    if jar.exists() and stamp.exists() and stamp.read_text() == want:
        return jar
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise RegistryUnavailable(f"{tool} is not installed (needed for Apicurio Registry)")
    CACHE.mkdir(parents=True, exist_ok=True)
    for path in files:
        target = CACHE / path.relative_to(PROJECT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    log = CACHE / "build.log"
    with log.open("wb") as out:
        code = subprocess.run(
            [
                "mvn",
                "-B",
                "-q",
                "-DskipTests",
                "-Dmaven.javadoc.skip",
                "-Dmaven.source.skip",
                "-Denforcer.skip",
                "-Dlicense.skip",
                "-Dcheckstyle.skip",
                "package",
            ],  # fmt: skip
            cwd=CACHE,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        ).returncode
    if code != 0 or not jar.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise RegistryUnavailable(f"building Apicurio Registry failed (exit {code}):\n{tail}")
    stamp.write_text(want)
    return jar


class RegistryServer:
    """One Apicurio Registry process on 127.0.0.1.

    Attributes:
        url: the Confluent-compatible base URL (give it to ``SchemaRegistry``).
        startup_seconds: from launching the JVM to the first answer of the API.
    """

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{CCOMPAT}"
        self.log_path = log_path
        self.startup_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 120) -> RegistryServer:
        """Start the registry and wait until its API answers.

        Raises:
            RegistryUnavailable: it exited or did not answer within ``timeout`` seconds.
        """
        jar = ensure_built()
        self._log = self.log_path.open("ab")
        env = {
            **os.environ,
            "QUARKUS_HTTP_HOST": "127.0.0.1",
            "QUARKUS_HTTP_PORT": str(self.port),
            "QUARKUS_PROFILE": "prod",
            "REGISTRY_LOG_LEVEL": "WARN",
        }
        began = time.monotonic()
        self._proc = subprocess.Popen(
            ["java", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-jar", str(jar)],
            cwd=jar.parent,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RegistryUnavailable(f"the registry exited early:\n{tail}")
            if self._answers():
                self.startup_seconds = time.monotonic() - began
                return self
            time.sleep(0.25)
        self.stop()
        raise RegistryUnavailable(f"the registry did not answer within {timeout:.0f} s")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as r:  # noqa: S310
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop the registry (SIGTERM, then SIGKILL after 20 s)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
