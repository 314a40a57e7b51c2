"""Build the Cython extensions and the C helpers in csrc/ (everything else lives in pyproject.toml)."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExtWithCsrc(build_ext):
    """build_ext that first builds the csrc/ static library (editable installs skip `build_clib` otherwise)."""

    def run(self):
        self.run_command("build_clib")
        super().run()

# csrc/ is plain C built once as a static library with strict warnings; the Cython-generated C is not held to -Werror.
CSRC_LIB = ("lmq_os", {"sources": ["csrc/lmq_os.c"], "cflags": ["-O3", "-fPIC", "-Wall", "-Wextra", "-Werror"]})
C_FLAGS = ["-O3", "-fno-strict-aliasing"]


def ext(name):
    path = name.replace(".", "/") + ".pyx"
    return Extension(
        name,
        [path],
        include_dirs=["csrc", numpy.get_include()],
        libraries=["lmq_os", "z"],
        extra_compile_args=C_FLAGS + ["-Wno-unused-function", "-Wno-unused-parameter",
                                      "-Wno-missing-field-initializers"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


extensions = [
    ext("localmq._native"),
    ext("localmq._codec"),
    ext("localmq._mapped_file"),
    ext("localmq._cq"),
    ext("localmq._commitlog"),
    ext("localmq._dispatch"),
    ext("localmq._frame"),
    ext("localmq._index"),
]

setup(
    cmdclass={"build_ext": BuildExtWithCsrc},
    libraries=[CSRC_LIB],
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": 3, "embedsignature": True},
    ),
)
