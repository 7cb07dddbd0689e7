"""Relayed writers' requests as the running node takes them in: decide, commit, ack.

A relayed device (a key, no replica) asks a relay for a template and submits
what it signed (`transport.relay` documents the messages). The decision is
the sans-IO `node.relay.RelayServer`'s; this module runs it inside a step of
the committer (the node's only writer), so what a submit added is durable
and announced before the device hears "accepted", and then asks for the
relay's ack at once (its duty: reference the relayed events). Kept apart
from `node.runtime`, which only routes the relay protocol here.

It knows the rest of the node only through callables (who is a device, the
ack duty, where a peer's connection comes from) and the node's live table of
joined topics, so it sits beside the runtime's other parts rather than above
them.

A request's *source* is the IP address of the requesting peer's connection
(`remote_ip`): a libp2p peer id is the device's key, and keys are free, so
the relay's per-source rate limit counts what an attacker cannot cycle as
cheaply. Unknown (no connection found): the key is its own source.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from node.committer import Act, Committer
from node.core.event import Event
from node.peer_ids import node_id_of
from node.relay import Handled, RelayServer
from node.replica.replica import Replica
from node.topic_handle import Topic
from transport.relay import Refused, RelayReason
from transport.relay import encode as encode_relay


def remote_ip(libp2p_host: Any, peer: str) -> str | None:
    """The IP address `peer`'s open connection comes from, or None if it has none here."""
    try:
        from libp2p.peer.id import ID

        for conn in libp2p_host.get_network().get_connections(ID.from_base58(peer)):
            address = conn.muxed_conn.get_remote_address()
            if address:
                return str(address[0])
    except Exception:  # a diagnostic lookup: any failure means "unknown source"
        return None
    return None


class RelayIntake:
    """Serves relayed devices' requests on a running node (`on_request`, the protocol handler)."""

    def __init__(self, committer: Committer, topics: Mapping[bytes, Topic],
                 add_relay_client: Callable[[str], None],
                 acknowledge: Callable[[int], Sequence[tuple[bytes, Event]]],
                 rng: random.Random,
                 source_of: Callable[[str], str | None] = lambda peer: None) -> None:
        self._committer = committer
        self._source_of = source_of  # peer id -> its connection's IP address (None: unknown)
        self._topics = topics  # the node's live table of joined topics
        self._add_relay_client = add_relay_client  # a device: no push fan-out, no anti-entropy
        self._acknowledge = acknowledge  # the ack duty, run inside a committer step
        self.server = RelayServer(self._replica, rng)

    def _replica(self, topic_id: bytes) -> Replica | None:
        topic = self._topics.get(topic_id)
        return None if topic is None else topic.replica

    async def on_request(self, peer: str, data: bytes) -> bytes:
        """A relayed device's request (node.relay, transport.relay). A submit is answered
        only after what it added is durable, disseminated, and an ack is asked for."""
        node_id = node_id_of(peer)
        if node_id is None:
            return encode_relay(Refused(RelayReason.BAD_REQUEST, "not an ed25519 peer id"))
        self._add_relay_client(node_id)
        device = bytes.fromhex(node_id)
        source = self._source_of(peer)
        handled: list[Handled] = []

        def run(now: int) -> list[tuple[bytes, Event]]:  # runs inside the committer's step
            handled.append(self.server.handle(device, data, now, source))
            return self._accepted(handled[0])

        await self._committer.submit(Act(run))  # committed, pushed on as its entry point
        if handled[0].wrote and handled[0].topic in self._topics:
            # The relay duty: reference them (rate-limited in the replica).
            await self._committer.submit(Act(self._acknowledge))
        return handled[0].response

    def _accepted(self, handled: Handled) -> list[tuple[bytes, Event]]:
        """What a submit added, for the committer to commit (one step) and announce."""
        if handled.topic is None or not handled.wrote or handled.topic not in self._topics:
            return []
        return [(handled.topic, event) for event in handled.applied]
