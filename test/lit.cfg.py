# lit configuration for the taso-mlir FileCheck suite (test/<Area>/*.mlir).
# Run: lit -v test      (needs `taso-opt`, `filecheck` and `python` on PATH, e.g. an activated venv)
import os
import shutil
import sys

import lit.formats

config.name = "taso"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(os.path.dirname(__file__), "..", ".lit_out")
config.excludes = ["unit", "Inputs", "lit.cfg.py", "CMakeLists.txt"]

# Tools come from the environment the suite is run in (the project's virtualenv).
config.environment["PATH"] = os.environ.get("PATH", "")
for var in ("HOME", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
# The IR debug mode (dialect/handles.py: the IR verified after every pass and step of taso-search, handles
# to erased ops kept readable and checked): on unless TASO_DEBUG_IR says otherwise.
config.environment["TASO_DEBUG_IR"] = os.environ.get("TASO_DEBUG_IR", "1")
# The target where a test names none: the analytic T4 profile, so that the checked IR does not depend on
# this machine's timings (taso-search's default, auto, measures on the CPU).
config.environment["TASO_TARGET"] = os.environ.get("TASO_TARGET", "analytic:t4")

filecheck = shutil.which("filecheck") or shutil.which("FileCheck")
if filecheck is None:
    lit_config.fatal("FileCheck not found: pip install 'taso-mlir[test]' (provides the filecheck package)")
taso_opt = shutil.which("taso-opt")
if taso_opt is None:
    lit_config.fatal("taso-opt not found on PATH: pip install -e . (or activate the virtualenv)")
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("FileCheck", filecheck))
