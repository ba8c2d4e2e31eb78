"""Install-time build of psbatch's compiled front end (everything else is in setup.cfg).

The ``psbatch`` script is built here, not declared as a console entry point: with a C
compiler it is the compiled front end (``pipeswift_slurm/submit/fast/psbatch.c``), which
runs the Python psbatch of this install (this interpreter) for Megatron jobs; without one
it is the usual Python script (``#!python``, which pip points at this interpreter).
``python -m pipeswift_slurm.submit.psbatch`` works either way.
"""

import os
import shutil
import sys
import tempfile

from setuptools import setup
from distutils.command.build_scripts import build_scripts  # setuptools provides it (after the import above)

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_SCRIPT = """#!python
import sys
from pipeswift_slurm.submit.psbatch import main
sys.exit(main())
"""


class BuildPsbatch(build_scripts):
    """Writes ``psbatch`` into the build's scripts folder: compiled when it can be."""

    def run(self):
        self.mkpath(self.build_dir)
        target = os.path.join(self.build_dir, "psbatch")
        sys.path.insert(0, HERE)  # psbatch's own light modules, from this source tree
        try:
            from pipeswift_slurm.submit.fast.build import BuildError, build

            try:
                build(target, python=os.environ.get("PIPESWIFT_PYTHON") or sys.executable)
                print("psbatch: compiled front end written to %s" % target)
                return
            except BuildError as exc:
                print("psbatch: no compiled front end (%s); installing the Python entry point" % exc)
        finally:
            sys.path.remove(HERE)
        folder = tempfile.mkdtemp(prefix="psbatch-script-")
        source = os.path.join(folder, "psbatch")
        with open(source, "w") as fh:
            fh.write(PYTHON_SCRIPT)
        self.scripts = [source]
        try:
            super().run()  # points #!python at the interpreter that runs it
        finally:
            shutil.rmtree(folder)


# ``scripts`` must be non-empty for setuptools to build and install any: the file named
# here is a stand-in, the command above writes the real ``psbatch``.
setup(scripts=["wrappers/psbatch"], cmdclass={"build_scripts": BuildPsbatch})
