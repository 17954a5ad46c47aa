"""The one compiled part: the typo table's hot loops (identity_server/_typo_native.c).

Everything else is in pyproject.toml. The extension is optional: where no C compiler is found
the install goes on without it, and identity_server/typo_table.py runs the same loops in Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "identity_server._typo_native",
            sources=["identity_server/_typo_native.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
