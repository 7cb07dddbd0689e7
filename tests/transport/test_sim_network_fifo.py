"""The simulator's FIFO links (`transport.sim.network`, `fifo=True`): a libp2p stream keeps order."""

from __future__ import annotations

import random

from transport.sim.network import Due, Network
from transport.sim.scenario import Scenario
from transport.sim.cli import build_parser, scenario_from_args


def deliveries(network: Network) -> list[tuple[int, int, int, bytes]]:
    return [(at, a, b, payload) for at, kind, a, b, payload in network.due(10_000)
            if kind == Due.DELIVER]


def sent(fifo: bool, seed: int = 3) -> list[tuple[int, int, int, bytes]]:
    network = Network(random.Random(seed), latency_ms=(5, 80), reorder=0.2, fifo=fifo)
    for step in range(200):
        network.now_ms = step  # one message a ms on each of two links
        network.transmit(0, 1, step.to_bytes(2, "big"))
        network.transmit(1, 0, step.to_bytes(2, "big"))
    return deliveries(network)


def test_fifo_links_deliver_each_link_s_messages_in_the_order_sent():
    for link in ((0, 1), (1, 0)):
        order = [int.from_bytes(p, "big") for _, a, b, p in sent(fifo=True) if (a, b) == link]
        assert order == list(range(200))


def test_plain_links_reorder_and_fifo_draws_the_same_latencies():
    plain, fifo = sent(fifo=False), sent(fifo=True)
    order = [int.from_bytes(p, "big") for _, a, b, p in plain if (a, b) == (0, 1)]
    assert order != sorted(order)  # each message its own latency: the default reorders
    # FIFO draws nothing more: a message arrives at its own time or, held behind the one
    # before it, later, never earlier.
    plain_at = {(a, p): at for at, a, _, p in plain}
    assert all(at >= plain_at[(a, p)] for at, a, _, p in fifo)
    assert sum(at == plain_at[(a, p)] for at, a, _, p in fifo) > 0


def test_links_keep_order_by_default_and_the_command_line_replays_either():
    assert Scenario(seed=4, nodes=5).fifo_links
    assert "--reordering-links" not in Scenario(seed=4, nodes=5).argv()
    for fifo in (True, False):
        scenario = Scenario(seed=4, nodes=5, fifo_links=fifo)
        assert scenario_from_args(build_parser().parse_args(scenario.argv())) == scenario
