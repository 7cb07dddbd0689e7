"""Node configuration: defaults, a TOML file, and validation with clear errors.

Every setting has a default, so `megnode run --data-dir D` works with no file.
A config file (TOML, `--config`) overrides defaults; command-line flags
override the file. Unknown keys are an error, not silently ignored: a typo in
`anti_entropy_interval_ms` should not quietly leave the default in place.

Example (deploy/examples/node.toml)::

    listen = ["/ip4/0.0.0.0/tcp/4001"]
    bootstrap = ["/ip4/192.0.2.10/tcp/4001/p2p/12D3KooW..."]
    fast_path = "tree"        # or "push" (random push), "gossipsub", "none" (anti-entropy only)
    mdns = false
    anti_entropy_interval_ms = 2000
    ack_interval_ms = 250     # an indexer's empty acknowledgements, at most one per interval
    log_dir = "logs"
    metrics_port = 0          # 0 = Prometheus exporter off
    connections_low = 16      # the connection manager's water marks and limits
    connections_high = 48
    max_connections = 128
    max_connections_per_ip = 8
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from transport.defaults import (
    DEFAULT_LISTEN,
    DEFAULT_RUN_LISTEN,
    DEFAULT_SYNC_INTERVAL_MS,
    DEFAULT_SYNC_JITTER_MS,
    MISBEHAVIOUR_THRESHOLD,
)

# The engine's defaults (transport.defaults), so a node and the simulator agree.
DEFAULT_ANTI_ENTROPY_INTERVAL_MS = DEFAULT_SYNC_INTERVAL_MS
DEFAULT_ANTI_ENTROPY_JITTER_MS = DEFAULT_SYNC_JITTER_MS
DEFAULT_COMMIT_INTERVAL_MS = 20  # how long received events may wait for a group commit
DEFAULT_WIDTH_SAMPLE_INTERVAL_MS = 1_000
DEFAULT_PEER_MISBEHAVIOUR_LIMIT = MISBEHAVIOUR_THRESHOLD  # invalid messages before a disconnect
DEFAULT_TRANSPORT_TIMEOUT_MS = 10_000  # transport.libp2p_streams / libp2p_patches defaults
MAX_CONFIG_BYTES = 256 * 1024
# The connection manager's defaults (node.core.connection_manager's LOW_WATER,
# HIGH_WATER, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_IP; a test checks they agree).
DEFAULT_CONNECTIONS_LOW = 16
DEFAULT_CONNECTIONS_HIGH = 48
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_MAX_CONNECTIONS_PER_IP = 8


class FastPath(StrEnum):
    """How new events travel first; anti-entropy repairs whatever it loses."""

    PUSH = "push"  # our batched push over libp2p streams, to random peers
    TREE = "tree"  # the same streams, eager along a tree and ids on the other links
    GOSSIPSUB = "gossipsub"  # libp2p GossipSub
    NONE = "none"  # anti-entropy only


FAST_PATHS = tuple(FastPath)
MAX_PEERS_LISTED = 256


class ConfigError(Exception):
    """The configuration is invalid; the message names the setting and the problem."""


@dataclass(frozen=True, slots=True)
class NodeConfig:
    listen: tuple[str, ...] = (DEFAULT_LISTEN,)
    bootstrap: tuple[str, ...] = ()
    # The tree: about one copy of each event per node instead of push's 4-7, at an
    # equal or lower p99 in the cluster bench (docs/anti-entropy.md, "The tree
    # becomes the default").
    fast_path: str = FastPath.TREE  # see FastPath
    # Find peers on the LAN by mDNS (node.mdns). Off by default: it announces the node
    # to the whole LAN, most servers and clouds carry no multicast, and a bootstrap
    # list is the predictable choice.
    mdns: bool = False
    anti_entropy_interval_ms: int = DEFAULT_ANTI_ENTROPY_INTERVAL_MS
    anti_entropy_jitter_ms: int = DEFAULT_ANTI_ENTROPY_JITTER_MS
    commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS
    width_sample_interval_ms: int = DEFAULT_WIDTH_SAMPLE_INTERVAL_MS
    peer_misbehaviour_limit: int = DEFAULT_PEER_MISBEHAVIOUR_LIMIT
    # How long a peer may take to open a stream or to take one message before the
    # stream (a write stall: the whole connection) is given up as dead. Long enough
    # for a busy peer on a slow link; tests shorten it to stop a node past it quickly.
    transport_timeout_ms: int = DEFAULT_TRANSPORT_TIMEOUT_MS
    # An indexer appends at most one empty acknowledgement per topic per interval
    # (node.replica.ordering): lower confirms sooner when writers go quiet, higher costs less.
    # None: node.replica.ordering's DEFAULT_ACK_INTERVAL_MS (not imported here: it would
    # load the replica's modules into every CLI call, doubling its start-up).
    ack_interval_ms: int | None = None
    # The most extremities one dummy event merges (node.core.parents.DepletionPolicy).
    # None: the event format's limit for dummies (node.core.event.MAX_DUMMY_PARENTS,
    # 64). Builds before 2026-11-28 refuse a dummy of more than 20 parents, and with it
    # everything written on it: set 20 while a fleet still runs such builds (docs/deploy.md,
    # "Upgrading a fleet"). Not imported here, as above.
    dummy_max_parents: int | None = None
    log_dir: str | None = "logs"  # relative to the data dir; None = no dissemination log
    metrics_port: int = 0
    # The connection manager (node.core.connection_manager): below `connections_low` the
    # node dials more peers from its peer book; above `connections_high` it closes the
    # least wanted down to `connections_low`; past `max_connections` (node-wide) or
    # `max_connections_per_ip` (one IP address, loopback exempt) a new connection is closed.
    # Dial the peers this node met before (its peer book, node.core.peer_book) at start
    # and whenever it holds fewer than `connections_low` connections. Off: only the
    # bootstrap list, mDNS and peer exchange bring peers (e.g. to look at a store alone).
    dial_known_peers: bool = True
    connections_low: int = DEFAULT_CONNECTIONS_LOW
    connections_high: int = DEFAULT_CONNECTIONS_HIGH
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_ip: int = DEFAULT_MAX_CONNECTIONS_PER_IP

    def connection_limits(self) -> Any:
        """The connection manager's limits (node.core.connection_manager.Limits)."""
        from node.core.connection_manager import Limits

        return Limits(self.connections_low, self.connections_high, self.max_connections,
                      self.max_connections_per_ip)

    def with_overrides(self, **overrides: Any) -> "NodeConfig":
        """A copy with the non-None overrides applied and validated."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        return validate(replace(self, **_coerce(changes)))


_LIST_FIELDS = {"listen", "bootstrap"}


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if k in _LIST_FIELDS and isinstance(v, list) else v
            for k, v in values.items()}


def validate(config: NodeConfig) -> NodeConfig:
    def positive(name: str, unit: str = "milliseconds") -> None:
        value = getattr(config, name)
        if type(value) is not int or value <= 0:
            raise ConfigError(f"{name} must be a positive integer ({unit}), got {value!r}")

    for name in ("anti_entropy_interval_ms", "commit_interval_ms", "width_sample_interval_ms",
                 "peer_misbehaviour_limit", "transport_timeout_ms"):
        positive(name)
    if config.ack_interval_ms is not None:
        positive("ack_interval_ms")
    if config.dummy_max_parents is not None:
        # Only when set: the CLI stays light. The policy's own check holds the range.
        from node.core.parents import MAX_DUMMY_PARENTS, MIN_D_MAX, DepletionPolicy

        value = config.dummy_max_parents
        try:
            if type(value) is not int:
                raise ValueError(value)
            DepletionPolicy(max_parents=value)
        except ValueError:
            raise ConfigError(f"dummy_max_parents must be an integer from {MIN_D_MAX + 1} to "
                              f"{MAX_DUMMY_PARENTS}, got {value!r}") from None
    for name in ("connections_high", "max_connections", "max_connections_per_ip"):
        positive(name, "connections")
    if type(config.connections_low) is not int or config.connections_low < 0:
        raise ConfigError("connections_low must be a non-negative integer")
    if not config.connections_low <= config.connections_high <= config.max_connections:
        raise ConfigError("connection limits must satisfy connections_low <= connections_high "
                          "<= max_connections")
    if type(config.anti_entropy_jitter_ms) is not int or config.anti_entropy_jitter_ms < 0:
        raise ConfigError("anti_entropy_jitter_ms must be a non-negative integer")
    for name in ("listen", "bootstrap"):
        value = getattr(config, name)
        if not isinstance(value, tuple) or not all(isinstance(a, str) and a.startswith("/")
                                                   for a in value):
            raise ConfigError(f"{name} must be a list of multiaddrs like /ip4/127.0.0.1/tcp/4001")
        if len(value) > MAX_PEERS_LISTED:
            raise ConfigError(f"{name} lists more than {MAX_PEERS_LISTED} addresses")
    if not config.listen:
        raise ConfigError("listen must name at least one address")
    for address in config.listen:
        _check_multiaddr("listen", address, peer=False)
    for address in config.bootstrap:
        _check_multiaddr("bootstrap", address, peer=True)
    if config.fast_path not in FAST_PATHS:
        raise ConfigError(f"fast_path must be one of {', '.join(FAST_PATHS)}, got {config.fast_path!r}")
    if type(config.mdns) is not bool:
        raise ConfigError("mdns must be true or false")
    if type(config.dial_known_peers) is not bool:
        raise ConfigError("dial_known_peers must be true or false")
    if type(config.metrics_port) is not int or not 0 <= config.metrics_port <= 65535:
        raise ConfigError("metrics_port must be a port number (0 turns the exporter off)")
    if config.log_dir is not None and not isinstance(config.log_dir, str):
        raise ConfigError("log_dir must be a path")
    return config


def _check_multiaddr(name: str, address: str, peer: bool) -> None:
    """A parseable multiaddr; a bootstrap address must also name its peer (/p2p/<id>)."""
    from multiaddr import Multiaddr  # py-libp2p's own parser: what the host will accept

    try:
        parsed = Multiaddr(address)
    except Exception as exc:
        raise ConfigError(f"{name}: {address!r} is not a valid multiaddr ({exc})") from None
    protocols = {p.name for p in parsed.protocols()}
    if "tcp" not in protocols:
        raise ConfigError(f"{name}: {address!r} has no /tcp/<port> part")
    if peer and "p2p" not in protocols:
        raise ConfigError(f"{name}: {address!r} does not end in /p2p/<peer id> "
                          "(`megnode status` on that node prints its full addresses)")


# `megnode run`'s defaults: the library's, but listening on every interface on a
# fixed port (transport.defaults.DEFAULT_RUN_LISTEN), so a device is reachable from the LAN.
RUN_DEFAULTS = NodeConfig(listen=(DEFAULT_RUN_LISTEN,))


def load_config(path: str | Path | None, defaults: NodeConfig = NodeConfig()) -> NodeConfig:
    """`defaults`, overridden by the TOML file at `path` if given."""
    if path is None:
        return defaults
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        values = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    known = {f.name for f in fields(NodeConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    try:
        return validate(replace(defaults, **_coerce(values)))
    except TypeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
