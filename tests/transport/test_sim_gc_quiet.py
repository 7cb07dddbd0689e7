"""The simulator's collector pause leaves the process as it found it (transport.sim.gc_quiet)."""

import gc

from transport.sim.gc_quiet import SIM_GC_THRESHOLD0, quiet_gc


def test_quiet_gc_freezes_inside_and_restores_on_exit():
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    try:
        with quiet_gc():
            assert gc.get_threshold()[0] == SIM_GC_THRESHOLD0
            assert gc.get_freeze_count() > frozen_before
            raise RuntimeError("a failing world")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
