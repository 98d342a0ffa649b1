"""Packaging beyond pyproject.toml: the start-up hook's .pth file, installed beside the package.

A .pth file must lie at the top of site-packages, where no package's data can go. build_py
puts it at the top of the built tree, which a wheel (`pip install .`, `pip wheel .`) installs
there, as coverage and pytest-cov ship theirs. An editable install (`pip install -e .`,
setuptools' editable_wheel) builds no tree: it runs build_py with editable_mode set and puts
into the wheel what the install command's install_lib holds (the unpacked editable wheel),
so there build_py writes the .pth into install_lib as well. tests/test_switch_safety.py
installs each way into a scratch environment and checks that the variable turns the switch on.
The .pth imports _codegen_cache_startup only when CODEGEN_CACHE_ENABLE is set (docs/tvm.md).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "codegen_cache_enable.pth"


class BuildWithStartupHook(build_py):
    """build_py that also puts the .pth file at the top of the built tree (and of an editable wheel)."""

    def run(self):
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)
        if getattr(self, "editable_mode", False):
            wheel_root = self.get_finalized_command("install").install_lib
            self.mkpath(wheel_root)
            self.copy_file(os.path.join("src", PTH), os.path.join(wheel_root, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithStartupHook})
