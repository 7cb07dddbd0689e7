"""Suite-wide settings.

Hypothesis: no per-example deadline. CI machines are shared and noisy (two
cores, other jobs), and a slow example is not a failure of the property under
test; tests that care about time measure it themselves (tests/bench).
"""

from hypothesis import settings

settings.register_profile("megnode", deadline=None)
settings.load_profile("megnode")
