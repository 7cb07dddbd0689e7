"""Dissemination defaults a node runs with: one named value each.

The engine (`transport.dissemination_config.DisseminationConfig`), the simulator and
the node's settings (`node.config.NodeConfig`) all take these, so a simulated
replica and a deployed node sync and judge peers alike. A module of its own,
importing nothing, because `node.config` is loaded by every CLI call and must
not pull in the engine.
"""

from __future__ import annotations

from typing import Final

# Anti-entropy: each replica opens an exchange with a peer about this often.
# 2 s keeps an idle network's background traffic low while push carries the
# fast path; the jitter spreads offers so nodes do not all sync in lockstep.
DEFAULT_SYNC_INTERVAL_MS: Final = 2_000
DEFAULT_SYNC_JITTER_MS: Final = 500
# Hard faults (malformed or forged events: `transport.misbehaviour`) from one
# peer before the engine asks to disconnect it: a correct peer never causes one.
MISBEHAVIOUR_THRESHOLD: Final = 20

# Where an embedded node (`Node.open`, tests) listens unless told otherwise:
# loopback, any free port.
DEFAULT_LISTEN: Final = "/ip4/127.0.0.1/tcp/0"
# Where `megnode run` listens unless its config or `--listen` says otherwise:
# every IPv4 interface, on a fixed port a fleet's bootstrap lists can name.
# (A host bound to 0.0.0.0 advertises its interfaces' addresses: transport.libp2p_listen.)
DEFAULT_RUN_PORT: Final = 4001
DEFAULT_RUN_LISTEN: Final = f"/ip4/0.0.0.0/tcp/{DEFAULT_RUN_PORT}"
