"""Build the Cython extensions and the C helpers in csrc/ (everything else lives in pyproject.toml)."""
import importlib.util
import os
import sys
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildExtWithCsrc(build_ext):
    """build_ext that first builds the csrc/ static library (editable installs skip `build_clib` otherwise)."""

    def run(self):
        self.run_command("build_clib")
        super().run()


def write_layout_pxd():
    """Generate localmq/_layout.pxd from localmq/layout.py, the one place the on-disk constants are written."""
    spec = importlib.util.spec_from_file_location("_localmq_layout", os.path.join(HERE, "localmq", "layout.py"))
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    path = os.path.join(HERE, "localmq", "_layout.pxd")
    text = layout.pxd_source()
    old = open(path).read() if os.path.exists(path) else None
    if old != text:  # rewrite only on change, so Cython's dependency tracking does not rebuild everything
        with open(path, "w") as f:
            f.write(text)


# csrc/ is plain C built once as a static library with strict warnings; the Cython-generated C is not held to -Werror.
CSRC_HEADERS = sorted(str(p) for p in Path("csrc").glob("*.h"))
# obj_deps: a changed header recompiles the library (build_clib compares only the .c files otherwise)
CSRC_LIB = ("lmq_os", {"sources": ["csrc/lmq_os.c", "csrc/lmq_shm.c", "csrc/lmq_crc.c"], "obj_deps": {"": CSRC_HEADERS},
                       "cflags": ["-O3", "-fPIC", "-Wall", "-Wextra", "-Werror"]})
CSRC_DEPENDS = CSRC_LIB[1]["sources"] + CSRC_HEADERS
C_FLAGS = ["-O3", "-fno-strict-aliasing"]
# A wheel's extensions are stripped of symbols and debug info (one was 2.27 MB, 0.37 MB stripped); in-place and editable
# builds keep them for profilers and debuggers (perf, py-spy --native, callgrind). LOCALMQ_KEEP_SYMBOLS=1 keeps them in
# a wheel too.
LINK_FLAGS = ["-s"] if "bdist_wheel" in sys.argv and not os.environ.get("LOCALMQ_KEEP_SYMBOLS") else []


def ext(name):
    path = name.replace(".", "/") + ".pyx"
    return Extension(
        name,
        [path],
        include_dirs=["csrc", numpy.get_include()],
        libraries=["lmq_os", "z"],
        extra_compile_args=C_FLAGS + ["-Wno-unused-function", "-Wno-unused-parameter",
                                      "-Wno-missing-field-initializers"],
        extra_link_args=LINK_FLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        # linked with the static lmq_os: a change in csrc/ relinks every extension (build_ext compares these too)
        depends=CSRC_DEPENDS,
    )


# native (one concern each), then the compiled parts of the store engine
extensions = [
    ext("localmq._native"),
    ext("localmq._shm"),
    ext("localmq._msg_id"),
    ext("localmq._record"),
    ext("localmq._columns"),
    ext("localmq._scan"),
    ext("localmq._snapshot"),
    ext("localmq._mapping"),
    ext("localmq._mapped_file"),
    ext("localmq._frame"),
    ext("localmq._index"),
    ext("localmq.store.consume_queue"),
    ext("localmq.store.get"),
    ext("localmq.store.put_result"),
    ext("localmq.store.put_args"),
    ext("localmq.store.group_commit"),
    ext("localmq.store.shared_commit"),
    ext("localmq.store.commit_log"),
    ext("localmq.store.dispatch"),
]

write_layout_pxd()
setup(
    cmdclass={"build_ext": BuildExtWithCsrc},
    libraries=[CSRC_LIB],
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": 3, "embedsignature": True},
    ),
)
