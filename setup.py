"""Packaging beyond pyproject.toml: the start-up hook's .pth file, installed beside the package.

A .pth file must lie at the top of site-packages, where no package's data can go; build_py
copies it there (as coverage and pytest-cov ship theirs). It imports _codegen_cache_startup only
when CODEGEN_CACHE_ENABLE is set (docs/tvm.md).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "codegen_cache_enable.pth"


class BuildWithStartupHook(build_py):
    """build_py that also puts the .pth file at the top of the built tree."""

    def run(self):
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithStartupHook})
