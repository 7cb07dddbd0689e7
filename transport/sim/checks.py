"""The checkers of a simulated world: what a run must satisfy, and the failure report.

Two kinds. `OrderWatch` runs while the world runs (after every tick of an
authorized node): a confirmed prefix never changes, and every replica's
confirmed order is a prefix of every other's - a safety violation seen
mid-run is recorded, since by the end it may have been papered over.
`check` runs at the end: every replica holds the identical graph (same event
ids, same forward extremities, nothing buffered), nothing any replica
accepted is lost (every created event and every event any replica applied is
everywhere), one confirmed order everywhere, the misbehaving peer banned by
every honest node it talked to, and no honest peer banned. With a banned
writer (`Scenario.banned_writer`): none of its events signed after its ban
took effect is in any other node's confirmed or tentative view. A failure raises
AssertionError naming the seed and the command that replays it.
`converged` is the liveness phase's stopping rule.

A private topic (`Scenario.invite`) adds one more: every frame sent to a
non-member node (`Scenario.outsiders`) is tallied by `Exposure`, and the
check requires that none carried an event of the topic or named one of its
event ids, on any path (push, offers, replies, wants, events, templates).
With a banned writer too, every frame a member sends the banned member once
its own state holds the ban is tallied the same way: nothing but the ban
event may be in it. The banned member of a private topic reads nothing once
banned, so it is not among the members that must converge
(`World.correct_members`). Nor are its writes that nobody else can complete:
a member that took some of them in before it held the ban, without their
parents, refuses the banned member's frames once it does, so they stay
buffered there (`stranded`) when no correct member holds those parents. (A
node's buffer bounds them: `limits.buffered_per_author`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from node.core.event import EventFormatError, decode_event, event_id_of
from node.replica.ordering import KIND_ACK
from transport.messages import (
    Events,
    JoinSubmit,
    JoinTemplate,
    Message,
    MessageError,
    Offer,
    Push,
    Reply,
    Want,
    decode,
)
from transport.sim.adversary import Adversary, BannedWriter
from transport.sim.scenario import Scenario
from transport.sim.simnode import SimNode

MAX_PROBLEMS = 5  # a failure report lists this many problems of each kind, not thousands


class OrderWatch:
    """Safety of the order, observed as it happens across all replicas."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.best_confirmed: tuple[bytes, ...] = ()  # the longest confirmed order seen anywhere

    def observe(self, node: SimNode, now_ms: int) -> None:
        """A confirmed prefix never changes, and every replica's confirmed order is a
        prefix of every other's."""
        order = node.replica.ordering
        if order is None:
            return
        confirmed = order.confirmed
        old = node.seen_confirmed
        if confirmed[:len(old)] != old:
            self.violations.append(f"node {node.index}: a confirmed position changed "
                                   f"at {now_ms} ms")
        overlap = min(len(confirmed), len(self.best_confirmed))
        if confirmed[:overlap] != self.best_confirmed[:overlap]:
            self.violations.append(f"node {node.index}: confirmed order disagrees with "
                                   f"another node's at {now_ms} ms")
        if len(confirmed) > len(self.best_confirmed):
            self.best_confirmed = confirmed
        node.seen_confirmed = confirmed


@dataclass
class Exposure:
    """What of the topic a non-member was sent: events and event ids (the root excepted)."""

    events: set[bytes] = field(default_factory=set)
    ids: set[bytes] = field(default_factory=set)
    frames: int = 0

    def note(self, data: bytes, topic: bytes) -> None:
        try:
            message = decode(data)
        except MessageError:
            return
        if message.topic != topic:
            return
        self.frames += 1
        events, ids = exposed(message)
        self.events |= events
        self.ids |= ids


def exposed(message: Message) -> tuple[set[bytes], set[bytes]]:
    """The events a message carries and the event ids it names, the topic id (its root,
    which whoever asks already knows) excepted: what a reader of it learns of the topic."""
    events: set[bytes] = set()
    ids: set[bytes] = set()
    if isinstance(message, (Push, Reply, Events)):
        events = {event_id_of(raw) for raw in message.events}
    elif isinstance(message, JoinSubmit):
        events = {event_id_of(message.raw)}
    if isinstance(message, Offer):
        ids = set(message.heads) | set(message.since)
    elif isinstance(message, Reply):
        ids = set(message.heads)
    elif isinstance(message, Want):
        ids = set(message.ids)
    elif isinstance(message, JoinTemplate):
        ids = set(message.parents) | set(message.auth)
    ids.discard(message.topic)
    return events, ids


class World(Protocol):
    """What the checkers read of a world (transport.sim.world.Cluster)."""

    seed: int
    scenario: Scenario
    nodes: list[SimNode]
    members: list[SimNode]  # the nodes of the topic (all but outsiders)
    exposure: dict[int, Exposure]  # node index of each outsider -> what it was sent
    late_payloads: dict[int, set[bytes]]  # node index of each late member -> full payloads sent
    adversary: Adversary | None
    banned: BannedWriter | None
    banned_exposure: Exposure  # what members holding the ban sent a private topic's banned member
    authorization: bool
    created: list[bytes]
    bans: list[tuple[int, str]]
    order_watch: OrderWatch

    @property
    def now_ms(self) -> int: ...

    @property
    def correct_members(self) -> list[SimNode]: ...

    def event_ids(self, index: int) -> set[bytes]: ...

    def replay_hint(self) -> str: ...


def held_ids(node: SimNode) -> set[bytes]:
    """The ids of the events `node` applied."""
    graph = node.replica.graph
    return {e.id for _, e in graph.deliveries(0, graph.delivered_count)}


def stranded(cluster: World, node: SimNode) -> int:
    """How many of `node`'s buffered events are a private topic's banned member's that no
    one can complete: every parent they wait for is held by no correct member (module
    docstring). 0 if any buffered event is another's or waits for a parent one holds."""
    banned = cluster.banned
    graph = node.replica.graph
    if banned is None or not banned.private or banned.ban_id is None \
            or not graph.buffered_count:
        return 0
    author = cluster.nodes[banned.index].replica.identity.public_key
    if any(event is None or event.author != author
           for event in map(graph.buffered_event, graph.buffered_ids())):
        return 0
    if any(member.replica.graph.has(parent) for parent in graph.missing_parents()
           for member in cluster.correct_members):
        return 0
    return graph.buffered_count


def converged(cluster: World) -> bool:
    """Identical graphs, nothing buffered, the adversary banned by all it talked to, and
    (authorized) one confirmed order that holds every non-ack event."""
    nodes = cluster.correct_members
    first = nodes[0].replica.graph
    heads = first.extremities()
    count = first.delivered_count
    if not all(n.alive and n.replica.graph.delivered_count == count
               and n.replica.graph.extremities() == heads for n in nodes):
        return False
    if any(n.replica.graph.buffered_count > stranded(cluster, n) for n in nodes):
        return False
    if cluster.banned is not None and not cluster.banned.done:
        return False  # the banned writer is still writing
    adversary = cluster.adversary
    if adversary is not None and not all(
            cluster.nodes[i].policy.is_banned(adversary.node_id, cluster.now_ms)  # type: ignore[union-attr]
            for i in adversary.neighbours):
        return False  # the liveness phase also waits for every neighbour to ban it
    return not cluster.authorization or order_settled(nodes)


def order_settled(nodes: list[SimNode]) -> bool:
    """Every replica confirmed the same sequence, and it holds every non-ack event."""
    orders = [n.replica.ordering for n in nodes]
    if any(o is None for o in orders):
        return False
    confirmed = orders[0].confirmed  # type: ignore[union-attr]
    if any(o.confirmed != confirmed for o in orders[1:]):  # type: ignore[union-attr]
        return False
    graph = nodes[0].replica.graph
    # `tentative` is the unconfirmed tail alone (node.replica.ordering, `TopicOrder`).
    return all(graph.get(i).kind == KIND_ACK
               for i in orders[0].tentative)  # type: ignore[union-attr]


def payloads_carried(data: bytes, topic: bytes) -> set[bytes]:
    """Ids of the events a frame of `topic` carries with their payload (not withheld)."""
    try:
        message = decode(data)
    except MessageError:
        return set()
    if message.topic != topic or not isinstance(message, (Push, Reply, Events)):
        return set()
    out = set()
    for raw in message.events:
        try:
            event = decode_event(raw)
        except EventFormatError:
            continue
        if not event.withheld:
            out.add(event.id)
    return out


def history_problems(cluster: World) -> list[str]:
    """Late members of a private topic (`Scenario.late`): each was sent no payload it may not
    read by the topic's history setting, and holds every payload it may read in full.

    "May read" is the creator's judgement (`Replica.may_read_payload`): it depends only on
    the state before each event, which every node resolves alike.
    """
    problems: list[str] = []
    creator = cluster.nodes[0].replica
    for index, sent in sorted(cluster.late_payloads.items()):
        node = cluster.nodes[index]
        key = node.identity.public_key
        leaked = [i for i in sent if (e := creator.graph.get(i)) is not None
                  and not creator.may_read_payload(key, e)]
        if leaked:
            problems.append(f"late member {index} was sent {len(leaked)} payloads from before "
                            "its join")
        graph = node.replica.graph
        short = [e.id for _, e in graph.deliveries(0, graph.delivered_count)
                 if e.withheld and (full := creator.graph.get(e.id)) is not None
                 and creator.may_read_payload(key, full)]
        if short:
            problems.append(f"late member {index} holds {len(short)} events it may read "
                            "without their payload")
    return problems


def banned_writer_problems(cluster: World) -> list[str]:
    """Bans that hold (issue 16): the banned writer's events signed once its replica saw
    the ban confirmed are in no view of the order on any other node."""
    banned = cluster.banned
    if banned is None:
        return []
    if banned.ban_id is None or not (banned.after or banned.done):
        return ["the banned writer was never banned, or wrote nothing after its ban took effect"]
    after = set(banned.after)
    problems: list[str] = []
    for node in cluster.members:
        order = node.replica.ordering
        if node.index == banned.index or order is None:
            continue
        shown = after.intersection(order.confirmed) | after.intersection(order.tentative)
        if shown:
            problems.append(f"node {node.index} shows {len(shown)} of the banned writer's "
                            f"{len(after)} post-ban events in its order")
        if len(problems) >= MAX_PROBLEMS:
            break
    # Its removal, and the removal's past (which it was joined to read: it may fetch
    # that, `Disseminator._on_removed_want`); nothing else.
    allowed = {banned.ban_id}
    holder = next((n for n in cluster.correct_members if n.replica.graph.has(banned.ban_id)),
                  None)
    if holder is not None:
        allowed.update(holder.replica.graph.ancestors([banned.ban_id]))
    leaked = cluster.banned_exposure
    if leaked.events - allowed or leaked.ids - allowed:
        problems.append(f"members that held the ban sent the banned member "
                        f"{len(leaked.events - allowed)} events and "
                        f"{len(leaked.ids - allowed)} event ids besides its removal "
                        f"and the removal's past")
    return problems


def check(cluster: World, converged: bool = True) -> None:
    """Every checker above; AssertionError naming the seed and the replay command."""
    problems: list[str] = []
    if not converged:
        problems.append(f"no convergence within {cluster.scenario.liveness_bound_ms} ms "
                        "of healing")
    nodes = cluster.correct_members
    sets = [held_ids(node) for node in nodes]
    union = set().union(*sets)
    accepted = union | set(cluster.created)
    for node, ids in zip(nodes, sets):
        i, graph = node.index, node.replica.graph
        if ids != accepted:
            problems.append(f"node {i} lacks {len(accepted - ids)} of {len(accepted)} events")
        if graph.extremities() != nodes[0].replica.graph.extremities():
            problems.append(f"node {i} has other extremities than node 0")
        if graph.buffered_count > stranded(cluster, node):
            problems.append(f"node {i} still buffers {graph.buffered_count} events")
        if len(problems) > MAX_PROBLEMS:
            break
    problems += cluster.order_watch.violations[:MAX_PROBLEMS]
    if cluster.authorization and converged:
        confirmed = {n.replica.ordering.confirmed for n in nodes}  # type: ignore[union-attr]
        if len(confirmed) != 1:
            problems.append(f"{len(confirmed)} different confirmed orders after healing")
    problems += banned_writer_problems(cluster)
    problems += history_problems(cluster)
    adversary = cluster.adversary
    if adversary is not None:
        banned_by = {node for node, peer in cluster.bans if peer == adversary.node_id}
        talked = set(adversary.neighbours)
        if talked - banned_by:
            problems.append(f"honest nodes {sorted(talked - banned_by)} never banned "
                            "the misbehaving peer")
    # Outsiders push events of a topic they are not in (`adversary.outsider_frames`):
    # members drop them unread, but a node that judges them (a banned member, which
    # takes frames from anyone: `Disseminator._accepts`) rightly bans their author.
    outsiders = {node.node_id for node in cluster.nodes if not node.member}
    wrongly = sorted({(node, peer) for node, peer in cluster.bans
                      if (adversary is None or peer != adversary.node_id)
                      and peer not in outsiders})
    if wrongly:
        problems.append(f"honest peers banned: {wrongly[:MAX_PROBLEMS]}")
    for index, seen in sorted(cluster.exposure.items()):
        if seen.events or seen.ids or cluster.nodes[index].replica.graph.delivered_count:
            problems.append(f"non-member node {index} was sent {len(seen.events)} events and "
                            f"{len(seen.ids)} event ids of the private topic")
    if problems:
        raise AssertionError(
            f"simulation failed (seed {cluster.seed}): " + "; ".join(problems)
            + f"\nreplay: {cluster.replay_hint()}")
