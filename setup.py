"""Build script: maps the top-level folders onto the `cairn.*` namespace and builds the Cython
extensions.

liburing is linked statically (`liburing.a`) and its symbols are not re-exported, so the built
extension needs no liburing at run time (DESIGN.md, "io_uring").
"""

import os

import numpy

from Cython.Build import cythonize
from setuptools import Extension, setup

TOP_LEVEL = ["common", "native", "osd", "mon", "client", "s3"]

LIBURING_STATIC = "/usr/lib/x86_64-linux-gnu/liburing.a"


def liburing_link_args():
    candidates = [LIBURING_STATIC, "/usr/lib/liburing.a", "/usr/local/lib/liburing.a"]
    for path in candidates:
        if os.path.exists(path):
            return [path, "-Wl,--exclude-libs,ALL"]
    raise SystemExit(
        "cairn: liburing.a not found (looked in %s); install it with "
        "'apt-get install -y liburing-dev'" % ", ".join(candidates)
    )


extensions = [
    Extension(
        "cairn.native._uring",
        ["native/_uring.pyx"],
        extra_compile_args=["-O2"],
        extra_link_args=liburing_link_args(),
    ),
    Extension(
        "cairn.native._blockcrc",
        ["native/_blockcrc.pyx"],
        include_dirs=["native", numpy.get_include()],
        extra_compile_args=["-O3"],
    ),
    # The frame parser and encoder the messenger runs (common/wire.py selects them).
    Extension(
        "cairn.common._wire",
        ["common/_wire.pyx"],
        include_dirs=["native"],
        depends=["native/crc32c_blocks.h", "native/blake2b_mac.h"],
        extra_compile_args=["-O2"],
    ),
    # ISA-L's erasure code (Debian's libisal-dev), the library pyeclib's isa_l backends run.
    Extension(
        "cairn.native._isal",
        ["native/_isal.pyx"],
        extra_compile_args=["-O2"],
        libraries=["isal"],
    ),
]

# cluster-scripts/ holds the bring-up tool; it installs as `cairn.cluster` (a folder name with a
# dash cannot be imported).
PACKAGE_DIRS = {"cairn." + name: name for name in TOP_LEVEL} | {"cairn.cluster": "cluster-scripts"}

setup(
    packages=list(PACKAGE_DIRS),
    package_dir=PACKAGE_DIRS,
    package_data={"cairn.native": ["*.pyi", "*.pyx", "*.h"], "cairn.common": ["*.pyx"],
                  "cairn.mon": ["console_static/*"]},
    ext_modules=cythonize(extensions, language_level=3),
    zip_safe=False,
)
