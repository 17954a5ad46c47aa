"""The one compiled part: the resolve core (identity_server/core/_compiled.pyx, Cython).

Everything else is in pyproject.toml, which lists Cython among the build requirements. The
extension is optional: where it cannot be built (no C compiler, no Python headers, no Cython),
the install goes on without it and `IDENTITY_CORE=auto` runs the reference core, with the same
answers. `pip install -v` shows why it was not built.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: the reference core only
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension("identity_server.core._compiled",
                   sources=["identity_server/core/_compiled.pyx"],
                   extra_compile_args=["-O2"])],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )
    for module in ext_modules:  # cythonize's copies do not keep `optional`
        module.optional = True

setup(ext_modules=ext_modules)
