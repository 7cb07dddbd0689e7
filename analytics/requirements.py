"""What the analytics need installed, and the one line that says how to get it.

`pip install megnode` installs the node alone; Spark, pandas and the plotting
stack come with the `analytics` extra. `python -m analytics` (and so
`megnode analyze`) checks for them before importing any, so a node-only
install gets the install line and exit status 2 instead of an ImportError.
Found by `importlib.util.find_spec`: nothing is imported (no JVM, no numpy).
"""

from __future__ import annotations

import importlib.util

# Import names of the analytics extra's packages (pyproject.toml), in its order.
ANALYTICS_MODULES = ("pyspark", "pandas", "matplotlib", "numpy")
INSTALL_COMMAND = "pip install 'megnode[analytics]'"


def missing_modules() -> list[str]:
    return [name for name in ANALYTICS_MODULES if importlib.util.find_spec(name) is None]


def install_hint(missing: list[str]) -> str:
    return (f"analyze needs the analytics extra (missing: {', '.join(missing)}); "
            f"install it with: {INSTALL_COMMAND}")
