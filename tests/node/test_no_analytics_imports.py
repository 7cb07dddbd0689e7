"""Nothing in node/, transport/, storage/ or deploy/ imports the analytics extra's packages
when imported: `pip install megnode` (without `[analytics]`) must run a node (issue 13)."""

from __future__ import annotations

import subprocess
import sys

from analytics.requirements import ANALYTICS_MODULES

SCRIPT = """
import importlib, pkgutil, sys
for package in ("node", "transport", "storage", "deploy"):
    root = importlib.import_module(package)
    for module in pkgutil.walk_packages(root.__path__, package + "."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
print(sorted(m for m in %r if m in sys.modules))
"""


def test_importing_every_node_module_loads_no_analytics_package() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT % (ANALYTICS_MODULES,)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
