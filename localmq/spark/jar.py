"""The JVM reader's jar for a pip user: compiled with javac + jar from the packaged sources, cached per user."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from localmq.errors import JarBuildError, MissingToolError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["JAR_NAME", "SOURCES", "jar_path", "configure_spark"]

JAR_NAME = "localmq-spark.jar"
# the Java sources and the service registration, shipped in the wheel as package data (Maven builds the same tree:
# spark-jvm/pom.xml)
SOURCES = Path(__file__).resolve().parent / "java"
SERVICES = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
# bumped when the recipe below changes, so a jar built by an older recipe is not reused
_RECIPE = "1"


def _pyspark_jars() -> tuple[str, Path]:
    """The installed pyspark's version and its ``jars`` directory (the Spark the reader is compiled against)."""
    try:
        import pyspark
    except ModuleNotFoundError as e:
        raise MissingToolError(
            "the JVM reader's jar is compiled against the installed pyspark, which is not "
            "installed: pip install 'localmq[spark]'",
            missing="pyspark",
        ) from e
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not any(jars.glob("spark-sql_*.jar")):
        # pyspark-client (Spark Connect only) ships no jars: there is no Spark in this process to read with
        raise MissingToolError(
            f"pyspark {pyspark.__version__} has no Spark jars in {jars} (a Spark Connect "
            "client?): install the full pyspark wheel",
            missing="pyspark jars",
        )
    return pyspark.__version__, jars


def _tool(name: str) -> str:
    """The path of JDK tool ``name`` (``javac``, ``jar``): on PATH, else in ``$JAVA_HOME/bin``."""
    found = shutil.which(name)
    home = os.environ.get("JAVA_HOME")
    if found is None and home:
        found = shutil.which(name, path=os.path.join(home, "bin"))
    if found is None:
        raise MissingToolError(
            f"building the JVM reader's jar needs the JDK's `{name}` (JDK 17 or later; a JRE has "
            f"none), on PATH or in $JAVA_HOME/bin: e.g. apt-get install openjdk-17-jdk-headless",
            missing=name,
        )
    return found


def _source_files() -> list[Path]:
    """Every file the jar is made of, in a stable order: the .java sources and the service registration."""
    files = sorted(SOURCES.rglob("*.java"))
    services = SOURCES / SERVICES
    if not files or not services.is_file():
        raise MissingToolError(
            f"the JVM reader's Java sources are not in {SOURCES} (an install without the package data?)",
            missing=str(SOURCES),
        )
    return files + [services]


def _digest(files: list[Path], spark_version: str) -> str:
    """A name for one build: the recipe, the pyspark version and every source file's path and bytes."""
    h = hashlib.sha256(f"{_RECIPE}\0{spark_version}\0".encode())
    for f in files:
        h.update(f.relative_to(SOURCES).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _default_cache() -> Path:
    """``$XDG_CACHE_HOME/localmq/spark`` (``~/.cache/localmq/spark`` by default): one user's built jars."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "localmq" / "spark"


def _build(out: Path, files: list[Path], jars: Path, javac: str, jar: str) -> None:
    """Compile ``files`` against ``jars`` and write the jar to ``out`` (in a directory of this build's own)."""
    classes = out.parent / "classes"
    classes.mkdir()
    sources = [str(f) for f in files if f.suffix == ".java"]
    # the classpath wildcard is expanded by javac itself; warnings are the developers' concern (Maven's -Werror)
    cmd = [
        javac,
        "--release",
        "17",
        "-encoding",
        "UTF-8",
        "-nowarn",
        "-proc:none",
        "-cp",
        str(jars / "*"),
        "-d",
        str(classes),
        *sources,
    ]
    _run(cmd, "javac")
    services = classes / SERVICES
    services.parent.mkdir(parents=True)
    shutil.copyfile(SOURCES / SERVICES, services)
    _run([jar, "--create", "--file", str(out), "-C", str(classes), "."], "jar")


def _run(cmd: list[str], what: str) -> None:
    """Run one build step, raising JarBuildError with its output when it fails."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        raise JarBuildError(f"{what} did not finish in {e.timeout:.0f} s", output="") from e
    if r.returncode != 0:
        output = (r.stdout + r.stderr)[-4000:]
        raise JarBuildError(f"{what} failed ({r.returncode}) building the JVM reader's jar:\n{output}", output=output)


def jar_path(cache_dir: Union[str, os.PathLike[str], None] = None) -> str:
    """The path of the JVM reader's jar (``format("localmq")`` / ``format("localmq-jvm")``), built on the first
    call with the JDK's ``javac`` and ``jar`` against the installed pyspark's jars (no Maven, no network).

    The jar is cached under ``cache_dir/<digest>/localmq-spark.jar``, the digest naming the Java sources and the
    pyspark version, so a new localmq or pyspark builds a new jar and a second call returns at once. It is built in a
    temporary directory beside and renamed into place under a lock: a concurrent caller (thread or process) waits
    for it and never sees a half-written jar.

    :param cache_dir: where built jars are kept; default ``$XDG_CACHE_HOME/localmq/spark`` (``~/.cache/...``).
    :returns: the absolute path of the jar.
    :raises MissingToolError: pyspark (or its jars), ``javac`` or ``jar`` is not installed; ``missing`` names it.
    :raises JarBuildError: javac or jar failed (``output`` holds what it printed).
    """
    version, jars = _pyspark_jars()
    files = _source_files()
    home = Path(cache_dir) if cache_dir is not None else _default_cache()
    slot = home / _digest(files, version)
    final = slot / JAR_NAME
    if final.is_file():
        return str(final)
    javac, jar = _tool("javac"), _tool("jar")
    slot.mkdir(parents=True, exist_ok=True)
    with open(slot / ".lock", "w") as lock:
        # one builder at a time; the loser finds the winner's jar below
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not final.is_file():
            work = Path(tempfile.mkdtemp(prefix=".build-", dir=slot))
            try:
                _build(work / JAR_NAME, files, jars, javac, jar)
                os.replace(work / JAR_NAME, final)  # atomic: the jar appears whole or not at all
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return str(final)


def configure_spark(builder: "SparkSession.Builder", jar: Optional[str] = None) -> "SparkSession.Builder":
    """Configure a ``SparkSession.builder`` for localmq, in the spirit of delta-spark's
    ``configure_spark_with_delta_pip``: the JVM reader's jar goes on ``spark.jars`` (after any jars already set) and
    Python workers run this interpreter (``sys.executable``, which has localmq) unless
    ``spark.pyspark.python`` / ``spark.pyspark.driver.python`` or ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON``
    already say otherwise.

    :param builder: ``SparkSession.builder`` (before ``getOrCreate()``).
    :param jar: the jar to add; default ``jar_path()`` (built on first use).
    :returns: ``builder``, for chaining: ``configure_spark(SparkSession.builder.master(...)).getOrCreate()``.
    :raises MissingToolError: see ``jar_path``.
    :raises JarBuildError: see ``jar_path``.
    """
    path = jar if jar is not None else jar_path()
    # the builder keeps what was set so far in _options (pyspark has no public getter before getOrCreate)
    options = {str(k): str(v) for k, v in getattr(builder, "_options", {}).items()}
    current = [j for j in options.get("spark.jars", "").split(",") if j.strip()]
    if path not in current:
        builder = builder.config("spark.jars", ",".join(current + [path]))
    for key, env in (
        ("spark.pyspark.python", "PYSPARK_PYTHON"),
        ("spark.pyspark.driver.python", "PYSPARK_DRIVER_PYTHON"),
    ):
        if key not in options and not os.environ.get(env):
            builder = builder.config(key, sys.executable)
    return builder
