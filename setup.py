"""Only the optional C kernel of the vector index; everything else is in pyproject.toml.

Without a C compiler (or on a CPU without AVX-512 VNNI) the build skips it and
laya.semantic.vectorindex answers with numpy alone: the same answers, slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("laya.semantic._scan", ["laya/semantic/_scan.c"], extra_compile_args=["-O3"],
                             optional=True)])
