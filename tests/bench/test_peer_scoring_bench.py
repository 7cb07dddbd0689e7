"""Attack volume in the engine (issue 16): offer-flood amplification, time to drop a flooder.

Engines wired by hand (`tests/transport/pair.py`, `tests/transport/mesh.py`),
no network: this measures what the engine answers and when it gives up on a
peer, not a socket. `measure()` runs against whatever `transport` is on the
path, so the same code gives the figures before the change:

    cd /work/main && PYTHONPATH=/work/main $WT/.venv/bin/python -c "import importlib.util as u; \
        s = u.spec_from_file_location('b', '$WT/tests/bench/test_peer_scoring_bench.py'); \
        m = u.module_from_spec(s); s.loader.exec_module(m); print(m.measure())"

Measured (2,000 events of 300 bytes at the responder; before → after):
offers naming the root, 300 in 3 s: 29,918 B in → 162,405,218 → 16,835,352 B out
(the 16 MiB allowance + 2 × in); 300 offers of 512 made-up heads and an empty
filter (5.2 MB): 162,317,918 → 0 B out, the peer dropped at the 20th; a
non-member pushing its own events at 1,000/s: never dropped → dropped after
737 ms (invite topic: stray allowance then 0.1 each) / 81 ms (public topic:
0.25 per unauthorized event). `make bench` writes bench-results/peer_scoring.json.
"""

from __future__ import annotations

import os
import random

from node.core.identity import sign_event
from tests.transport.mesh import Mesh
from tests.transport.pair import lagging
from transport.dissemination_config import DisseminationConfig
from transport.effects import Disconnect, Send
from transport.messages import BLOOM_SALT_BYTES, BloomFilter, Offer, Push, encode

ATTACKER = "ee" * 32
FLOOD_OFFERS = 300  # of 512 made-up heads each: ~5 MB, the first offer flood
FLOOD_STEP_MS = 10  # 100 offers a second
FLOODER_MESSAGES = 5_000  # 1 ms apart: 1,000 messages a second


def _offer_flood(made_up: bool) -> dict[str, float]:
    pair = lagging(2_000, payload_bytes=300)
    engine = pair.engines["b"]
    engine.on_peer_up(ATTACKER, pair.now_ms)
    rng = random.Random(7)
    bytes_in = bytes_out = 0
    for xid in range(1, FLOOD_OFFERS + 1):
        pair.now_ms += FLOOD_STEP_MS
        heads = ([rng.randbytes(32) for _ in range(512)] if made_up
                 else [pair.topic] * 1)  # the root: "send me everything", every time
        bloom = BloomFilter.build([], os.urandom(BLOOM_SALT_BYTES), 10, 7)
        data = encode(Offer(pair.topic, xid, tuple(heads), (), 0, False, bloom))
        bytes_in += len(data)
        bytes_out += sum(len(e.data) for e in engine.on_message(ATTACKER, data, pair.now_ms)
                         if isinstance(e, Send))
    allowance = getattr(engine.config, "answer_allowance_bytes", 0)  # absent before issue 16
    return {"bytes_in": bytes_in, "bytes_out": bytes_out,
            "out_per_in": round(bytes_out / bytes_in, 2),
            "out_beyond_allowance_per_in": round(max(0, bytes_out - allowance) / bytes_in, 2)}


def _flooder(join_rule: str) -> dict[str, float | None]:
    """A non-member pushes its own signed events, one a message, 1 ms apart."""
    mesh = Mesh(["a", "x"], join_rule=join_rule,
                config=DisseminationConfig(log=False, depletion=False, sync_on_connect=False))
    engine = mesh.engines["a"]
    engine.on_peer_up(mesh.ids["x"], mesh.now_ms)
    start = mesh.now_ms
    for seq in range(1, FLOODER_MESSAGES + 1):
        event = sign_event(mesh.replicas["x"].identity, topic=mesh.topic, seq=seq,
                           parents=[mesh.topic], timestamp_ms=mesh.now_ms, kind="message",
                           payload=b"spam%d" % seq, auth=(mesh.topic,))
        mesh.now_ms += 1
        effects = engine.on_message(mesh.ids["x"], encode(Push(mesh.topic, (event.raw,))),
                                    mesh.now_ms)
        if any(isinstance(e, Disconnect) for e in effects):
            return {"messages_to_drop": seq, "ms_to_drop": mesh.now_ms - start}
    return {"messages_to_drop": None, "ms_to_drop": None}


def measure() -> dict[str, dict]:
    return {
        "offer_flood_known_head": _offer_flood(made_up=False),
        "offer_flood_made_up_heads": _offer_flood(made_up=True),
        "non_member_flood_invite_topic": _flooder("invite"),
        "non_member_flood_public_topic": _flooder("public"),
    }


def test_peer_scoring_bench(record_figures):
    figures = measure()
    record_figures("peer_scoring", figures)
    for flood in ("offer_flood_known_head", "offer_flood_made_up_heads"):
        assert figures[flood]["out_beyond_allowance_per_in"] <= 2
