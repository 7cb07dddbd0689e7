"""Node configuration: the TOML file, its validation, and the shipped example."""

import re
from pathlib import Path

import pytest

from node.config import ConfigError, NodeConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "node.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def test_the_shipped_example_is_valid_and_keeps_mdns_off():
    config = load_config(EXAMPLE)
    assert config.mdns is False
    assert config.listen == ("/ip4/0.0.0.0/tcp/4001",)


def test_mdns_defaults_off_and_can_be_switched_on(tmp_path):
    assert NodeConfig().mdns is False
    assert load_config(write(tmp_path, "mdns = true\n")).mdns is True


@pytest.mark.parametrize("value", ['"yes"', "1", "[]"])
def test_mdns_must_be_a_boolean(tmp_path, value):
    with pytest.raises(ConfigError, match="mdns must be true or false"):
        load_config(write(tmp_path, f"mdns = {value}\n"))


def test_a_misspelt_setting_is_an_error_not_a_silent_default(tmp_path):
    with pytest.raises(ConfigError, match="unknown setting.*mnds"):
        load_config(write(tmp_path, "mnds = true\n"))


def test_the_ack_interval_is_a_setting(tmp_path):
    config = load_config(write(tmp_path, "ack_interval_ms = 1000\n"))
    assert config.ack_interval_ms == 1000
    with pytest.raises(ConfigError, match="ack_interval_ms must be a positive integer"):
        load_config(write(tmp_path, "ack_interval_ms = 0\n"))


@pytest.mark.parametrize("value", ["1", "65", "20.5", '"20"', "true"])
def test_the_dummies_width_is_a_setting_within_the_formats_limit(tmp_path, value):
    assert load_config(write(tmp_path, "dummy_max_parents = 20\n")).dummy_max_parents == 20
    assert load_config(write(tmp_path, "")).dummy_max_parents is None
    with pytest.raises(ConfigError, match="dummy_max_parents must be an integer from 2 to 64"):
        load_config(write(tmp_path, f"dummy_max_parents = {value}\n"))


def test_the_transport_timeout_is_a_setting_defaulting_to_the_transports(tmp_path):
    from node.config import DEFAULT_TRANSPORT_TIMEOUT_MS
    from transport.libp2p_streams import MESSAGE_WRITE_TIMEOUT_S, OPEN_STREAM_TIMEOUT_S
    from transport.libp2p_patches import WRITE_STALL_TIMEOUT_S

    assert (DEFAULT_TRANSPORT_TIMEOUT_MS / 1000 == MESSAGE_WRITE_TIMEOUT_S == OPEN_STREAM_TIMEOUT_S
            == WRITE_STALL_TIMEOUT_S)
    assert load_config(write(tmp_path, "transport_timeout_ms = 1500\n")).transport_timeout_ms == 1500
    with pytest.raises(ConfigError, match="transport_timeout_ms must be a positive integer"):
        load_config(write(tmp_path, "transport_timeout_ms = 0\n"))


async def test_a_running_node_applies_the_transport_timeout_and_restores_the_stall_bound(tmp_path):
    from node.runtime import Node
    from transport import libp2p_patches

    before = libp2p_patches.stall_timeout_s
    async with Node.open(tmp_path / "n", config=NodeConfig(transport_timeout_ms=1500)) as node:
        limits = node.host._limits
        assert (limits.open_stream_timeout_s, limits.message_write_timeout_s,
                limits.write_stall_timeout_s) == (1.5, 1.5, 1.5)
        assert libp2p_patches.stall_timeout_s == 1.5  # one value per process
    assert libp2p_patches.stall_timeout_s == before


async def test_a_running_node_acks_at_the_configured_interval(tmp_path):
    from node.replica.ordering import DEFAULT_ACK_INTERVAL_MS
    from node.runtime import Node

    async with Node.open(tmp_path / "n", config=NodeConfig(ack_interval_ms=1234)) as node:
        topic = await node.create_topic("acks")
        assert topic.replica.config.ordering.ack_interval_ms == 1234
    # Unset, the replicas get the ordering's own default.
    async with Node.open(tmp_path / "m") as node:
        topic = await node.create_topic("acks")
        assert topic.replica.config.ordering.ack_interval_ms == DEFAULT_ACK_INTERVAL_MS


async def test_a_running_node_holds_its_dummies_to_the_configured_width(tmp_path):
    """`dummy_max_parents = 20`: a fleet upgrading from builds that refuse wider dummies
    (docs/deploy.md). Unset, dummies take the format's limit for them."""
    from node.core.event import MAX_DUMMY_PARENTS
    from node.runtime import Node

    async with Node.open(tmp_path / "n", config=NodeConfig(dummy_max_parents=20)) as node:
        topic = await node.create_topic("narrow")
        assert topic.replica.config.depletion.dummy_parents(topic.replica.params.d_max) == 20
    async with Node.open(tmp_path / "m") as node:
        topic = await node.create_topic("wide")
        assert topic.replica.config.depletion.max_parents == MAX_DUMMY_PARENTS


def test_the_cli_does_not_load_the_replica_to_read_its_config():
    """`megnode status` and friends import node.config: it must stay light."""
    import subprocess
    import sys

    probe = "import sys, node.config; print('node.replica.ordering' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("setting, address, words", [
    ("listen", "/ip4/127.0.0.1/tcp/99999", "not a valid multiaddr"),
    ("listen", "/ip4/999.0.0.1/tcp/1", "not a valid multiaddr"),
    ("listen", "/ip4/127.0.0.1/udp/4001", "no /tcp/"),
    ("bootstrap", "/ip4/127.0.0.1/tcp/4001", "/p2p/<peer id>"),
])
def test_addresses_are_parsed_when_the_config_is_read(tmp_path, setting, address, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        load_config(write(tmp_path, f'{setting} = ["{address}"]\n'))


async def test_a_port_another_process_holds_is_refused_not_shared(tmp_path):
    """py-libp2p listens with SO_REUSEPORT: without the probe, a second node would share it."""
    import socket

    from node.runtime import Node, NodeError

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as libp2p's listener does
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(NodeError, match="cannot listen.*in use"):
            async with Node.open(tmp_path / "n", listen=[f"/ip4/127.0.0.1/tcp/{port}"]):
                pass
    finally:
        holder.close()


async def test_an_error_inside_the_node_block_comes_out_as_itself(tmp_path):
    from node.runtime import Node

    class Mine(Exception):
        pass

    with pytest.raises(Mine):
        async with Node.open(tmp_path / "n"):
            raise Mine()
