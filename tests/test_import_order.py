"""Every module of onebuild imports on its own, as the first onebuild module of a fresh
interpreter: an import cycle that the usual order hides (a CLI command, a worker process or a
user's script importing a leaf module first) fails here. `targets/binary.py` importing
`quant/params.py` first once broke every `.tvn` command this way."""

import subprocess
import sys
from pathlib import Path

import onebuild

ROOT = Path(onebuild.__file__).parent
MODULES = sorted(
    ".".join(("onebuild", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
    for path in ROOT.rglob("*.py")
)

CHECK = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "onebuild" or m.startswith("onebuild.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as error:
        failed.append(f"{name}: {type(error).__name__}: {error}")
print("\\n".join(failed))
"""


def test_every_module_imports_first():
    assert len(MODULES) > 100
    result = subprocess.run(
        [sys.executable, "-c", CHECK, *MODULES], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "", result.stdout
