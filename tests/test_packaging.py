"""The wheel a user installs: the license, the compiled modules stripped, stubs and py.typed, no generated C, the
JVM reader's Java sources."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_BUILD_PRODUCTS = shutil.ignore_patterns(
    ".git",
    "build",
    "*.so",
    "__pycache__",
    "*.egg-info",
    ".mypy_cache",
    "target",
    "fixtures",
    "results",
    "plots",
    ".benchmarks",
)


def _not_sources(directory, names):
    """What a source checkout holds beside the sources: build products, caches, the C that Cython generates (csrc's
    own C is source)."""
    skip = set(_BUILD_PRODUCTS(directory, names))
    if Path(directory).resolve() != (REPO / "csrc").resolve():
        skip.update(n for n in names if n.endswith(".c"))
    return skip


@pytest.mark.timeout(900)
def test_the_wheel_has_the_license_stripped_modules_and_no_generated_c(tmp_path):
    """Issue 23: the wheel shipped the 11 generated .c files, unstripped extensions (one 2.27 MB, 0.37 MB stripped)
    and no license. Built from a copy of the sources (csrc's and Cython's C regenerated there), without build
    isolation, so nothing is downloaded: the test extra installs setuptools, Cython and numpy."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=_not_sources)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wheel"),
        ],
        capture_output=True,
        text=True,
        timeout=840,
        env={**os.environ, "LOCALMQ_KEEP_SYMBOLS": ""},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("localmq-*.whl")
    z = zipfile.ZipFile(wheel)
    names = z.namelist()
    assert [n for n in names if n.endswith(".c")] == []
    licenses = [n for n in names if n.endswith("/LICENSE")]
    assert licenses and b"Apache License" in z.read(licenses[0])
    assert "localmq/py.typed" in names and "localmq/_record.pyi" in names
    modules = [n for n in names if n.endswith(".so")]
    # every Cython module of the sources is compiled and shipped
    assert len(modules) == len(list((REPO / "localmq").rglob("*.pyx"))), modules
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils, installed with gcc) is needed to read the modules' sections"
    for n in modules:
        so = tmp_path / Path(n).name
        so.write_bytes(z.read(n))
        sections = subprocess.run([readelf, "-S", "-W", str(so)], capture_output=True, text=True, check=True).stdout
        assert ".symtab" not in sections and ".debug_info" not in sections, f"{n} is not stripped"
        assert z.getinfo(n).file_size < 1_000_000, (n, z.getinfo(n).file_size)
    # issue 28: the JVM reader's sources and service registration, so localmq.spark.jar_path() can build its jar
    # where the wheel is installed, and both auto-discovered Spark entries (localmq, localmq-python)
    java = REPO / "localmq" / "spark" / "java"
    shipped = sorted(p.relative_to(REPO).as_posix() for p in java.rglob("*") if p.is_file())
    assert len(shipped) > 20 and "localmq/spark/java/localmq/spark/LocalMQProvider.java" in shipped, shipped
    assert sorted(n for n in names if n.startswith("localmq/spark/java/")) == shipped
    services = "localmq/spark/java/META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
    assert z.read(services) == (REPO / services).read_bytes()
    assert "localmq/spark/jar.py" in names
    assert "pyspark_localmq/__init__.py" in names and "pyspark_localmq_python/__init__.py" in names
