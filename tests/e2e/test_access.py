"""End to end: who reads an invite topic, with four real `megnode run` daemons.

Node 0 creates an invite topic and invites nodes 1 and 2. Node 3 is not
invited: its `topic join` exits 2 with one line, fast, and it holds nothing of
the topic. Invited, it joins and receives everything. Banned, it receives
nothing new while the others keep receiving. A join whose sponsor is gone before
passing it on still reaches the members, and two members each joined in a view
without the other's join still meet. A member banned while it was away learns of
its ban when it is back. Every wait polls a condition
under a named bound (deploy.cluster); nothing sleeps and hopes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from deploy.cluster import LocalCluster
from node.runtime import JOIN_HANDSHAKE_TIMEOUT_S

WAIT_S = 30.0
MESSAGES = 20
BANNED = 3
MEMBERS = [0, 1, 2]
# Anti-entropy repairs a lost push sooner with a short interval.
FAST_ANTI_ENTROPY = "anti_entropy_interval_ms = 500\nanti_entropy_jitter_ms = 100\n"


def publish(cluster: LocalCluster, index: int, topic: str, label: str) -> None:
    lines = "\n".join(f"{label} {n}" for n in range(MESSAGES))
    result = cluster.cli_raw(index, "publish", topic, "-", "--lines", input_text=lines)
    assert result.returncode == 0, result.stderr


def payloads(cluster: LocalCluster, index: int, topic: str) -> list[str]:
    """The payloads of every event node `index` delivered so far (its `subscribe`)."""
    count = cluster.topic_status(index, topic)["delivered"]
    result = cluster.cli_raw(index, "subscribe", topic, "--kinds", "message,state,ack",
                             "--count", str(count), timeout_s=WAIT_S)
    assert result.returncode == 0, result.stderr
    return [json.loads(line).get("payload", "") for line in result.stdout.splitlines()]


def messages_delivered(cluster: LocalCluster, index: int, topic: str) -> int:
    """Delivered events other than the indexers' acks (which the ticker adds any time)."""
    status = cluster.topic_status(index, topic)
    return status["delivered"] - status["acks"]


def wait_member_state(cluster: LocalCluster, topic: str, member: str, membership: str,
                      indices: list[int]) -> None:
    """Wait until `member`'s membership in each node's resolved state is `membership`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        seen = {}
        for i in indices:
            state = cluster.cli(i, "topic", "state", topic)
            entry = state.get(f"m.room.member|{member}") or {}
            seen[i] = (entry.get("content") or {}).get("membership")
        if all(value == membership for value in seen.values()):
            return
        assert time.monotonic() < deadline, f"{member} memberships {seen}, not {membership}"
        time.sleep(0.2)


def test_only_members_read_an_invite_topic(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(FAST_ANTI_ENTROPY)
    with LocalCluster(tmp_path / "c", 4, extra_args=("--config", str(config))) as cluster:
        topic = cluster.cli(0, "topic", "create", "private", "--access", "invite")["topic"]
        for i in (1, 2):
            cluster.cli(0, "topic", "invite", topic, cluster.nodes[i].node_id)
            cluster.cli(i, "topic", "join", topic)  # returns once a member
        cluster.wait_joined(topic, WAIT_S, indices=MEMBERS)

        # Not invited: one line, exit 6 (topic not found), within the handshake's bound;
        # nothing kept.
        started = time.monotonic()
        refused = cluster.cli_raw(BANNED, "topic", "join", topic)
        took = time.monotonic() - started
        assert refused.returncode == 6, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert f"topic {topic} not found or you are not invited (asked 3 peers)" in lines[0]
        assert took < JOIN_HANDSHAKE_TIMEOUT_S, took
        assert cluster.status(BANNED)["topics"] == []

        publish(cluster, 0, topic, "before invite")
        member_messages = messages_delivered(cluster, 0, topic)
        cluster.wait_delivered(topic, member_messages, WAIT_S, indices=MEMBERS)
        assert cluster.status(BANNED)["topics"] == []  # the members sent it nothing

        # Invited: it joins and receives everything (the history before its join too).
        node3 = cluster.nodes[BANNED].node_id
        cluster.cli(0, "topic", "invite", topic, node3)
        joined = cluster.cli(BANNED, "topic", "join", topic)
        assert joined == {"topic": topic, "ready": True, "membership": "join"}
        publish(cluster, 0, topic, "after invite")
        everything = messages_delivered(cluster, 0, topic)
        cluster.wait_delivered(topic, everything, WAIT_S)
        held = payloads(cluster, BANNED, topic)
        assert {f"before invite {n}" for n in range(MESSAGES)} <= set(held)
        assert {f"after invite {n}" for n in range(MESSAGES)} <= set(held)

        # Banned: once the ban is resolved at the members, nothing new reaches it.
        cluster.cli(0, "topic", "ban", topic, node3)
        wait_member_state(cluster, topic, node3, "ban", MEMBERS)
        before_ban = messages_delivered(cluster, BANNED, topic)
        publish(cluster, 0, topic, "after ban")
        cluster.wait_delivered(topic, messages_delivered(cluster, 0, topic), WAIT_S,
                               indices=MEMBERS)  # the others keep receiving
        for i in MEMBERS:
            assert {f"after ban {n}" for n in range(MESSAGES)} <= set(payloads(cluster, i, topic))
        assert not [p for p in payloads(cluster, BANNED, topic) if p.startswith("after ban")]
        assert messages_delivered(cluster, BANNED, topic) == before_ban
        # Its node was handed its own ban, so its subscribe ends, with one line and status 7.
        ended = cluster.cli_raw(BANNED, "subscribe", topic, timeout_s=WAIT_S)
        assert ended.returncode == 7 and "banned" in ended.stderr, ended.stderr
        assert len(ended.stderr.strip().splitlines()) == 1, ended.stderr

        # history = joined (a topic of its own): a late member reads from its join on only.
        wrong = cluster.cli_raw(0, "topic", "create", "x", "--history", "joined")
        assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
        assert "history joined needs access invite" in wrong.stderr
        later = cluster.cli(0, "topic", "create", "joined", "--access", "invite",
                            "--history", "joined")["topic"]
        publish(cluster, 0, later, "early")
        cluster.cli(0, "topic", "invite", later, node3)
        assert cluster.cli(BANNED, "topic", "join", later) == {"topic": later, "ready": True,
                                                          "membership": "join"}
        publish(cluster, 0, later, "late")
        deadline = time.monotonic() + WAIT_S
        while not {f"late {n}" for n in range(MESSAGES)} <= set(payloads(cluster, BANNED, later)):
            assert time.monotonic() < deadline, "the late member did not get its events"
            time.sleep(0.2)
        held = payloads(cluster, BANNED, later)
        assert not [p for p in held if p.startswith("early")], held
        status = cluster.topic_status(BANNED, later)
        assert status["withheld"] >= MESSAGES  # it holds the early vertices, not their payloads


def test_a_join_whose_sponsor_is_gone_reaches_the_members(tmp_path: Path) -> None:
    """Node 1 takes node 2's join in while node 0, the creator, is down, and is gone for
    good before passing it on. When node 0 is back and meets node 2, it refuses node 2's
    frames (to it node 2 is only invited), says it lacks node 2's join, gets it, and
    fetches from node 2 what node 1 wrote before it (transport.join_handshake)."""
    config = tmp_path / "node.toml"
    config.write_text(FAST_ANTI_ENTROPY)
    with LocalCluster(tmp_path / "c", 3, extra_args=("--config", str(config))) as cluster:
        topic = cluster.cli(0, "topic", "create", "private", "--access", "invite")["topic"]
        joiner = cluster.nodes[2].node_id
        for i in (1, 2):
            cluster.cli(0, "topic", "invite", topic, cluster.nodes[i].node_id)
            cluster.cli(0, "topic", "add-writer", topic, cluster.nodes[i].node_id)
        cluster.cli(1, "topic", "join", topic)
        cluster.wait_joined(topic, WAIT_S, indices=[0, 1])
        wait_member_state(cluster, topic, joiner, "invite", [0, 1])
        deadline = time.monotonic() + WAIT_S
        while cluster.cli_raw(1, "publish", topic, "warm").returncode != 0:  # a writer yet?
            assert time.monotonic() < deadline, "node 1 never became a writer"
            time.sleep(0.2)

        cluster.stop(0)
        publish(cluster, 1, topic, "sponsor")  # the join's parents: node 0 lacks them
        assert cluster.cli(2, "topic", "join", topic)["membership"] == "join"
        cluster.kill(1)  # gone for good, the join passed on to no one

        cluster.start_node(0, bootstrap=[cluster.nodes[2].address])
        wait_member_state(cluster, topic, joiner, "join", [0])
        publish(cluster, 2, topic, "joiner")
        deadline = time.monotonic() + WAIT_S
        while not {f"joiner {n}" for n in range(MESSAGES)} <= set(payloads(cluster, 0, topic)):
            assert time.monotonic() < deadline, "the creator did not get the joiner's events"
            time.sleep(0.2)
        held = set(payloads(cluster, 0, topic))
        assert {f"sponsor {n}" for n in range(MESSAGES)} <= held  # fetched from the joiner


def _wait_writer(cluster: LocalCluster, index: int, topic: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while cluster.cli_raw(index, "publish", topic, "warm").returncode != 0:  # a writer yet?
        assert time.monotonic() < deadline, f"node {index} never became a writer"
        time.sleep(0.2)


def test_two_members_each_joined_without_the_other_s_join_meet(tmp_path: Path) -> None:
    """Node 2 joins through node 1 while nodes 0, 3 and 4 are down; node 4 through node 3
    while nodes 0, 1 and 2 are down; then nodes 1 and 3 are gone for good. When 2 and 4
    meet, each counts the other as invited only, so neither would send the other
    anything. Each, with no reader connected, tells the other it lacks its join; they
    trade joins and each join's past (transport.join_handshake)."""
    config = tmp_path / "node.toml"
    config.write_text(FAST_ANTI_ENTROPY)
    with LocalCluster(tmp_path / "c", 5, extra_args=("--config", str(config))) as cluster:
        topic = cluster.cli(0, "topic", "create", "private", "--access", "invite")["topic"]
        ids = [node.node_id for node in cluster.nodes]
        for i in (1, 2, 3, 4):
            cluster.cli(0, "topic", "invite", topic, ids[i])
        for i in (1, 3):
            cluster.cli(0, "topic", "add-writer", topic, ids[i])
            cluster.cli(i, "topic", "join", topic)
        cluster.wait_joined(topic, WAIT_S, indices=[0, 1, 3])
        for i in (2, 4):
            wait_member_state(cluster, topic, ids[i], "invite", [0, 1, 3])
        for i in (1, 3):
            _wait_writer(cluster, i, topic)

        for i in (0, 3, 4):
            cluster.stop(i)
        publish(cluster, 1, topic, "one")  # the parents of node 2's join
        assert cluster.cli(2, "topic", "join", topic)["membership"] == "join"
        cluster.kill(1)
        cluster.stop(2)

        cluster.start_node(3, bootstrap=[])
        cluster.start_node(4, bootstrap=[cluster.nodes[3].address])
        publish(cluster, 3, topic, "three")  # the parents of node 4's join
        assert cluster.cli(4, "topic", "join", topic)["membership"] == "join"
        cluster.kill(3)

        cluster.start_node(2, bootstrap=[cluster.nodes[4].address])
        wait_member_state(cluster, topic, ids[4], "join", [2])
        wait_member_state(cluster, topic, ids[2], "join", [4])
        wanted = {2: {f"three {n}" for n in range(MESSAGES)},
                  4: {f"one {n}" for n in range(MESSAGES)}}
        deadline = time.monotonic() + WAIT_S
        while not all(wanted[i] <= set(payloads(cluster, i, topic)) for i in wanted):
            assert time.monotonic() < deadline, "nodes 2 and 4 did not trade what they held"
            time.sleep(0.2)


def test_a_join_whose_sponsor_also_invited_and_is_gone_reaches_the_members(
        tmp_path: Path) -> None:
    """Node 1 (an indexer, so it may invite) invites node 2 and takes its join in while
    node 0, the creator, is down, then is gone for good. To node 0, back, node 2 is a
    stranger: it drops node 2's frames without a word. Node 2's exchange with it times
    out, and node 2 hands it its join with the invite (transport.join_handshake)."""
    config = tmp_path / "node.toml"
    config.write_text(FAST_ANTI_ENTROPY)
    with LocalCluster(tmp_path / "c", 3, extra_args=("--config", str(config))) as cluster:
        topic = cluster.cli(0, "topic", "create", "private", "--access", "invite")["topic"]
        ids = [node.node_id for node in cluster.nodes]
        cluster.cli(0, "topic", "invite", topic, ids[1])
        cluster.cli(1, "topic", "join", topic)
        cluster.cli(0, "topic", "set-role", topic, ids[1], "indexer")
        cluster.wait_joined(topic, WAIT_S, indices=[0, 1])
        _wait_writer(cluster, 1, topic)  # its role reached it: it may invite too

        cluster.stop(0)
        publish(cluster, 1, topic, "sponsor")  # the invite's parents: node 0 lacks them
        cluster.cli(1, "topic", "invite", topic, ids[2])
        assert cluster.cli(2, "topic", "join", topic)["membership"] == "join"
        cluster.kill(1)

        cluster.start_node(0, bootstrap=[cluster.nodes[2].address])
        wait_member_state(cluster, topic, ids[2], "join", [0])
        wanted = {f"sponsor {n}" for n in range(MESSAGES)}
        deadline = time.monotonic() + WAIT_S
        while not wanted <= set(payloads(cluster, 0, topic)):  # fetched from the joiner
            assert time.monotonic() < deadline, "the creator did not get node 1's last events"
            time.sleep(0.2)


def test_a_member_banned_while_away_learns_of_its_ban_when_it_is_back(tmp_path: Path) -> None:
    """Node 2 is down while node 0 writes and then bans it: the ban names events node 2
    never had. Back, its node still counts itself a member and asks; node 0 hands it
    its ban, and serves it the ban's past (which it was joined to read) and nothing
    after. So its `subscribe` ends, with status 7 (before, it waited forever)."""
    config = tmp_path / "node.toml"
    config.write_text(FAST_ANTI_ENTROPY)
    with LocalCluster(tmp_path / "c", 3, extra_args=("--config", str(config))) as cluster:
        topic = cluster.cli(0, "topic", "create", "private", "--access", "invite")["topic"]
        ids = [node.node_id for node in cluster.nodes]
        for i in (1, 2):
            cluster.cli(0, "topic", "invite", topic, ids[i])
            cluster.cli(i, "topic", "join", topic)
        cluster.wait_joined(topic, WAIT_S, indices=[0, 1, 2])

        cluster.stop(2)
        publish(cluster, 0, topic, "while away")  # the ban's past: node 2 lacks it
        cluster.cli(0, "topic", "ban", topic, ids[2])
        wait_member_state(cluster, topic, ids[2], "ban", [0, 1])
        publish(cluster, 0, topic, "after ban")

        cluster.start_node(2, bootstrap=[cluster.nodes[0].address])
        wait_member_state(cluster, topic, ids[2], "ban", [2])
        ended = cluster.cli_raw(2, "subscribe", topic, timeout_s=WAIT_S)
        assert ended.returncode == 7 and "banned" in ended.stderr, ended.stderr
        held = set(payloads(cluster, 2, topic))
        assert {f"while away {n}" for n in range(MESSAGES)} <= held  # the ban's past
        assert not [p for p in held if p.startswith("after ban")]
