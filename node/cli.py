"""The `megnode` command line.

    megnode keygen --data-dir D              create the node's identity key
    megnode run --data-dir D [...]           run the daemon (Ctrl-C stops it cleanly;
                                             --reinit: accept a lost store, docs/store.md)
    megnode topic create NAME --data-dir D   create a topic; prints its id
    megnode topic join TOPIC --data-dir D    join a topic by id; returns once a member (exit 6
                                             and one line if no peer lets this node in);
                                             --wait [--timeout S]: also a topic held here
    megnode topic leave TOPIC --data-dir D
    megnode topic list | members TOPIC | info TOPIC --data-dir D
    megnode topic state TOPIC --data-dir D   the resolved topic state
    megnode topic set-state TOPIC TYPE KEY JSON --data-dir D
    megnode topic invite|add-writer|ban TOPIC MEMBER --data-dir D
    megnode topic set-role TOPIC MEMBER indexer|writer|relayed|none --data-dir D
    megnode publish TOPIC MESSAGE --data-dir D      (MESSAGE "-" reads stdin, --file F a file;
                                                      --lines: one event per line, streamed
                                                      in atomic batches; --binary, --base64)
    megnode subscribe TOPIC --data-dir D [--kinds message,state,ack] [--since CURSOR|ID]
                      [--count N] [--causal|--confirmed|--tentative] [--base64]
    megnode relay-publish TOPIC MESSAGE --key K --relay ADDR [--join] [--lines]
                                             a keys-only device publishes via a relay
    megnode status --data-dir D              peers, bans, topics, delivered, rejections (docs/control.md)
    megnode connect ADDRESS --data-dir D     dial a peer by its /p2p/ address
    megnode export-logs --data-dir D OUT     copy the dissemination logs for analysis
    megnode check --data-dir D               integrity check of a stopped node's store
                                             (exit 0 clean, 1 damage found)
    megnode repair TOPIC --data-dir D        drop a damaged topic's state; refetched on start
    megnode backup OUT --data-dir D          consistent copy of the store (daemon running or not)
    megnode restore FROM --data-dir D [--force]   put a backup in place (daemon stopped)
    megnode analyze LOGDIR --out REPORT      Spark analysis of collected logs
    megnode simulate [...]                   the deterministic simulator

Every command but `run`, `keygen`, `relay-publish`, `export-logs`, `check`, `repair`,
`restore`, `analyze` and `simulate` talks to the daemon over its control socket
(`backup` does when a daemon runs, else it copies the stopped node's store itself) (`relay-publish` needs
no daemon: it dials the relay itself, node.relay_client). User mistakes (bad address,
bad topic id, unreadable key, data dir in use, no daemon running) give one
clear line on stderr and exit status 2; nothing prints a traceback for them. The
daemon's refusals map to exit statuses by kind (EXIT_CODES below; docs/control.md):
a refused join (`topic join` of a topic no connected peer lets this node into:
unknown to them, or not invited) prints "topic <id> not found or you are not
invited (asked N peers)" and exits 6 within the handshake timeout
(node.runtime.JOIN_HANDSHAKE_TIMEOUT_S).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from node.cli_surface import (  # the user surface: errors, exit statuses, publish, subscribe
    DEFAULT_DATA_DIR, EXIT_FAILURE, Parser, EXIT_OK, EXIT_USAGE, JOIN_WAIT_S, CONTROL_SLACK_S,
    TOPIC_VIEW_COMMANDS, UserError, _control, _data_dir, _positive_seconds, _print_json,
    add_publish_arguments, add_subscribe_arguments, add_topic_view_parsers, cmd_topic_view,
    finish_help, publish_command, subscribe_command)
from node.config import FAST_PATHS, RUN_DEFAULTS, ConfigError, load_config
from node.control_client import CONTROL_SOCKET
from node.daemon_log import LogFileError, setup_daemon_log
from node.sd_notify import Notice, notify
from node.core.identity import Identity
from node.core.store import StoreError
from node.keyfile import KeyFileError, save_identity

KEY_FILE = "node.key"  # the same name node.runtime uses
DAEMON_UMASK = 0o077  # `run`: files for the node's user only


# ---------------------------------------------------------------------- commands


def cmd_keygen(args: argparse.Namespace) -> int:
    path = Path(args.key_file) if args.key_file else _data_dir(args) / KEY_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {path.parent}: {exc.strerror}") from None
    identity = Identity.generate()
    try:
        save_identity(identity, path)
    except KeyFileError as exc:
        raise UserError(str(exc)) from None
    from transport.libp2p_identity import peer_id_of_public_key

    _print_json({"key_file": str(path), "public_key": identity.public_key.hex(),
                 "peer_id": peer_id_of_public_key(identity.public_key)})
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    import trio

    from node.control import serve_control
    from node.runtime import Node, NodeError

    # Everything the daemon creates (store, logs, control socket, key) is for
    # its user only, whatever umask it was started with (docs/store.md).
    os.umask(DAEMON_UMASK)
    try:
        config = load_config(args.config, RUN_DEFAULTS).with_overrides(
            listen=args.listen or None, bootstrap=args.bootstrap or None,
            fast_path=args.fast_path, log_dir=args.log_dir)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    try:
        setup_daemon_log(args.log_file, args.verbose)
    except LogFileError as exc:
        raise UserError(str(exc)) from None
    daemon_log = logging.getLogger("megnode")

    async def main() -> None:
        async with Node.open(args.data_dir, config=config, reinit=args.reinit) as node:
            # What exists once the node is open (modules, classes, the replicas as
            # loaded) lives as long as the process: frozen, the cyclic collector
            # no longer scans it at every full collection. A 50k catch-up ran five
            # full collections of ~75 ms each (pauses of the whole node), ~11 ms
            # frozen (docs/anti-entropy.md, s24). Garbage is still freed by
            # reference counts; only cycles among these objects would stay.
            gc.collect()
            gc.freeze()
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_control, node, Path(args.data_dir) / CONTROL_SOCKET)
                # Catch the signals before saying "started": a SIGTERM sent as soon
                # as the line appears must stop the node cleanly (exit 0) too.
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    _print_json({"event": "started", "node": node.node_id,
                                 "peer_id": node.host.peer_id, "addresses": list(node.addresses)})
                    daemon_log.info("started node %s, listening on %s", node.node_id,
                                    ", ".join(node.addresses))
                    # systemd's Type=notify: the node listens and answers its control
                    # socket now (a blocking datagram to a local socket: instant).
                    notify(Notice.READY, f"listening on {', '.join(node.addresses)}")
                    async for _ in signals:
                        break
                notify(Notice.STOPPING)
                nursery.cancel_scope.cancel()
        daemon_log.info("stopped")
        _print_json({"event": "stopped"})

    try:
        trio.run(main)
    except (NodeError, StoreError) as exc:  # StoreError: a store damaged under a running node
        raise UserError(str(exc)) from None
    except BaseExceptionGroup as group:  # e.g. the control socket's NodeError, from a nursery
        from node.runtime import sole_exception

        sole = sole_exception(group)
        if isinstance(sole, (NodeError, StoreError)):
            raise UserError(str(sole)) from None
        raise
    return EXIT_OK


def cmd_topic(args: argparse.Namespace) -> int:
    if args.topic_command == "create":
        reply = _control(args, {"op": "topic_create", "name": args.name, "d_max": args.d_max,
                                "access": args.access, "history": args.history})
        _print_json({"topic": reply["topic"]})
    elif args.topic_command == "state":
        print(json.dumps(_control(args, {"op": "state", "topic": args.topic})["state"], indent=2))
    elif args.topic_command == "set-state":
        try:
            content = json.loads(args.content)
        except json.JSONDecodeError as exc:
            raise UserError(f"content is not JSON: {exc}") from None
        reply = _control(args, {"op": "set_state", "topic": args.topic, "type": args.type,
                                "state_key": args.state_key, "content": content})
        _print_json({"id": reply["id"]})
    elif args.topic_command in ("invite", "add-writer", "ban", "set-role"):
        request = {"op": args.topic_command.replace("-", "_"), "topic": args.topic,
                   "member": args.member}
        if args.topic_command == "set-role":
            request["role"] = args.role
        _print_json({"id": _control(args, request)["id"]})
    elif args.topic_command == "join":
        request = {"op": "topic_join", "topic": args.topic, "wait": args.wait}
        if args.wait:
            request["timeout"] = args.timeout
        reply = _control(args, request, timeout_s=args.timeout + CONTROL_SLACK_S)
        _print_json({"topic": reply["topic"], "ready": reply["ready"],
                     "membership": reply.get("membership")})
    elif args.topic_command in TOPIC_VIEW_COMMANDS:
        return cmd_topic_view(args)
    else:
        _control(args, {"op": "topic_leave", "topic": args.topic})
        _print_json({"left": args.topic})
    return EXIT_OK


def cmd_publish(args: argparse.Namespace) -> int:
    return publish_command(args)


def cmd_relay_publish(args: argparse.Namespace) -> int:
    """Publish as a relayed writer: sign with --key, hand the events to --relay."""
    import trio

    from node.relay_client import RelayedWriter, RelayError

    if args.message is None and not args.join:
        raise UserError("give a MESSAGE (or '-' for stdin), or --join")
    if args.lines and args.message != "-":
        raise UserError("--lines reads messages from stdin: give '-' as the message")
    payloads: list[bytes] = []
    if args.message is not None:
        text = sys.stdin.read() if args.message == "-" else args.message
        payloads = ([line.encode() for line in text.splitlines()] if args.lines
                    else [text.encode()])

    async def main() -> None:
        async with RelayedWriter.open(args.key, args.relay, args.topic) as writer:
            if args.join:
                _print_json({"joined": (await writer.join()).hex()})
            for event_id in await writer.publish_many(payloads):
                _print_json({"id": event_id.hex()})

    try:
        trio.run(main)
    except RelayError as exc:
        raise UserError(str(exc)) from None
    return EXIT_OK


def cmd_subscribe(args: argparse.Namespace) -> int:
    return subscribe_command(args)


def cmd_status(args: argparse.Namespace) -> int:
    reply = _control(args, {"op": "status"})
    print(json.dumps(reply["status"], indent=2))
    return EXIT_OK


def cmd_peers(args: argparse.Namespace) -> int:
    reply = _control(args, {"op": "peers"})
    print(json.dumps(reply["peers"], indent=2))
    return EXIT_OK


def cmd_connect(args: argparse.Namespace) -> int:
    reply = _control(args, {"op": "connect", "address": args.address})
    _print_json({"peer": reply["peer"]})
    return EXIT_OK


def cmd_export_logs(args: argparse.Namespace) -> int:
    source = _data_dir(args) / args.log_dir
    if not source.is_dir():
        raise UserError(f"no dissemination logs in {source}")
    out = Path(args.out)
    copied = 0
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path in sorted(source.glob("*.jsonl")):
            shutil.copy2(path, out / path.name)
            copied += 1
    except OSError as exc:
        raise UserError(f"cannot export logs to {out}: {exc.strerror or exc}") from None
    _print_json({"copied": copied, "to": str(out)})
    return EXIT_OK


def _store_dir(args: argparse.Namespace) -> Path:
    return _data_dir(args) / "store"  # node.runtime.STORE_DIR (not imported: it loads libp2p)


def cmd_check(args: argparse.Namespace) -> int:
    """Print one JSON line per topic and a summary line; exit 0 clean, 1 damage found."""
    from node.check import CheckError, check_data_dir
    from node.core.store import StoreError

    try:
        report = check_data_dir(_store_dir(args))
    except (CheckError, StoreError) as exc:  # StoreLockedError: a daemon runs
        raise UserError(f"cannot check: {exc}") from None
    for topic in report.topics:
        _print_json(topic.as_json())
    _print_json(report.summary_json())
    return EXIT_OK if report.ok else EXIT_FAILURE


def cmd_repair(args: argparse.Namespace) -> int:
    from node.check import CheckError, repair_topic
    from node.core.store import StoreError

    try:
        topic = bytes.fromhex(args.topic)
    except ValueError:
        topic = b""
    if len(topic) != 32:
        raise UserError(f"not a topic id (64 hex characters): {args.topic!r}")
    try:
        result = repair_topic(_store_dir(args), topic)
    except (CheckError, StoreError) as exc:
        raise UserError(f"cannot repair: {exc}") from None
    _print_json({"repaired": args.topic, "keys_deleted": result.deleted,
                 "record_kept": result.recorded})
    return EXIT_OK


def cmd_backup(args: argparse.Namespace) -> int:
    from node.backup import BackupError, backup_offline
    from node.core.store import StoreError
    from storage.lmdb_data_dir import StoreLockedError

    out = Path(args.out).absolute()
    try:
        reply = backup_offline(_store_dir(args), out)
    except StoreLockedError:  # a daemon holds the store: it makes the copy
        reply = _control(args, {"op": "backup", "path": str(out)})
        reply.pop("ok", None)
    except (BackupError, StoreError) as exc:
        raise UserError(f"cannot back up: {exc}") from None
    _print_json(reply)
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    from node.backup import BackupError, restore
    from node.core.store import StoreError

    try:
        _print_json(restore(_store_dir(args), Path(args.source), force=args.force))
    except (BackupError, StoreError) as exc:  # StoreLockedError: a daemon runs
        raise UserError(f"cannot restore: {exc}") from None
    return EXIT_OK


# ---------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="megnode", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_data_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                       help=f"the node's data directory (default: {DEFAULT_DATA_DIR})")
        return p

    p = with_data_dir(commands.add_parser("keygen", help="create the node's identity key"))
    p.add_argument("--key-file", help="write the key here instead of <data-dir>/node.key")
    p.set_defaults(func=cmd_keygen)

    p = with_data_dir(commands.add_parser("run", help="run the daemon"))
    p.add_argument("--config", help="a TOML config file (see deploy/examples/node.toml)")
    p.add_argument("--listen", action="append",
                   help="multiaddr to listen on (repeatable; default /ip4/0.0.0.0/tcp/4001, "
                        "every interface; /ip4/127.0.0.1/tcp/0 for this machine only)")
    p.add_argument("--bootstrap", action="append", help="peer /p2p/ address to dial (repeatable)")
    p.add_argument("--fast-path", choices=FAST_PATHS, help="how new events spread quickly")
    p.add_argument("--log-dir", help="dissemination log dir, relative to the data dir")
    p.add_argument("--log-file", help="the daemon's own log, and every library's (py-libp2p's "
                   "included), goes to this file, rotated, instead of stderr")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="-v: the node's info lines; -vv: its debug lines and the libraries' "
                        "info lines; -vvv: everything (default: warnings only)")
    p.add_argument("--reinit", action="store_true",
                   help="start with an empty store although this node has run before "
                        "(its store is missing or empty; docs/store.md)")
    p.set_defaults(func=cmd_run)

    p = commands.add_parser("topic", help="create, join or leave topics")
    topic_commands = p.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    q = with_data_dir(topic_commands.add_parser("create", help="create a topic"))
    q.add_argument("name")
    q.add_argument("--d-max", type=int, default=None, help="parents per event (1..20)")
    q.add_argument("--access", choices=("open", "invite"), default="open",
                   help="open: anyone with the id may join and publish; invite: members are "
                        "invited and writers granted (default: open)")
    q.add_argument("--history", choices=("shared", "joined"), default="shared",
                   help="invite topics: shared: members read all history; joined: a member "
                        "reads events from its join on (default: shared)")
    q = with_data_dir(topic_commands.add_parser("state", help="the topic's resolved state"))
    q.add_argument("topic")
    q = with_data_dir(topic_commands.add_parser("set-state", help="set a state entry"))
    q.add_argument("topic")
    q.add_argument("type", help="state type, e.g. app.config or m.room.topic")
    q.add_argument("state_key", help='the state key ("" for a single entry)')
    q.add_argument("content", help="a JSON object")
    for action, text in (("invite", "invite a member (by node id)"),
                         ("add-writer", "invite a member and let it publish"),
                         ("ban", "ban a member")):
        q = with_data_dir(topic_commands.add_parser(action, help=text))
        q.add_argument("topic")
        q.add_argument("member", help="the member's node id (64 hex, from `megnode status`)")
    q = with_data_dir(topic_commands.add_parser("set-role", help="make a member an indexer, "
                                                "writer, relayed writer or reader"))
    q.add_argument("topic")
    q.add_argument("member")
    q.add_argument("role", choices=("indexer", "writer", "relayed", "none"))
    q = with_data_dir(topic_commands.add_parser("join", help="join a topic by id"))
    q.add_argument("topic")
    q.add_argument("--wait", action="store_true",
                   help="return only once this node is a joined member (also of a topic "
                        "held here already), or fail with the reason")
    q.add_argument("--timeout", type=_positive_seconds, default=JOIN_WAIT_S,
                   help="seconds --wait waits (exit 8 past them)")
    add_topic_view_parsers(topic_commands, with_data_dir)
    q = with_data_dir(topic_commands.add_parser("leave", help="leave a topic"))
    q.add_argument("topic")
    p.set_defaults(func=cmd_topic)

    p = with_data_dir(commands.add_parser("publish", help="publish a message to a topic"))
    add_publish_arguments(p)
    p.set_defaults(func=cmd_publish)

    p = with_data_dir(commands.add_parser("subscribe", help="print a topic's events as JSON lines"))
    add_subscribe_arguments(p)
    p.set_defaults(func=cmd_subscribe)

    p = commands.add_parser("relay-publish", help="publish as a relayed writer (a key, no "
                                                  "replica) through a relay node")
    p.add_argument("topic")
    p.add_argument("message", nargs="?", help='the message text, or "-" to read it from stdin')
    p.add_argument("--key", required=True, help="the device's key file (megnode keygen --key-file)")
    p.add_argument("--relay", required=True, help="the relay node's /p2p/ address")
    p.add_argument("--join", action="store_true",
                   help="first join the topic as a relayed writer (once, after an admin's "
                        "`topic add-writer TOPIC DEVICE_KEY`)")
    p.add_argument("--lines", action="store_true",
                   help="publish each line of stdin as its own event (batched)")
    p.set_defaults(func=cmd_relay_publish)

    p = with_data_dir(commands.add_parser("status", help="the daemon's state as JSON"))
    p.set_defaults(func=cmd_status)

    p = with_data_dir(commands.add_parser(
        "peers", help="connected and known peers: addresses, topics, last seen, backoff (JSON)"))
    p.set_defaults(func=cmd_peers)

    p = with_data_dir(commands.add_parser("connect", help="dial a peer"))
    p.add_argument("address")
    p.set_defaults(func=cmd_connect)

    p = with_data_dir(commands.add_parser("export-logs", help="copy dissemination logs"))
    p.add_argument("out")
    p.add_argument("--log-dir", default="logs")
    p.set_defaults(func=cmd_export_logs)

    p = with_data_dir(commands.add_parser(
        "check", help="check a stopped node's store; exit 0 clean, 1 damage found"))
    p.set_defaults(func=cmd_check)

    p = with_data_dir(commands.add_parser(
        "repair", help="drop a damaged topic's stored state (the node refetches it from peers)"))
    p.add_argument("topic")
    p.set_defaults(func=cmd_repair)

    p = with_data_dir(commands.add_parser("backup", help="a consistent copy of the store "
                                          "into the empty directory OUT (hot, if a daemon runs)"))
    p.add_argument("out")
    p.set_defaults(func=cmd_backup)

    p = with_data_dir(commands.add_parser("restore", help="put a backup in place "
                                          "(the daemon must be stopped)"))
    p.add_argument("source", metavar="FROM")
    p.add_argument("--force", action="store_true", help="replace an existing store")
    p.set_defaults(func=cmd_restore)

    # Listed for --help; main() hands their arguments to their own parsers.
    commands.add_parser("analyze", help="Spark analysis of logs (see `megnode analyze -h`)")
    commands.add_parser("simulate", help="the deterministic simulator (`megnode simulate -h`)")
    finish_help(parser)
    return parser


# Commands whose arguments belong to another module's parser, passed through whole.
PASS_THROUGH = {"analyze": lambda rest: _analytics_main(["analyze", *rest]),
                "simulate": lambda rest: _sim_main(rest)}


def _analytics_main(argv: list[str]) -> int:
    """`python -m analytics` in a process of its own, same arguments, its exit status.

    A subprocess, not an import: the node never imports analytics (the layering
    contract in pyproject.toml), and the Spark driver is a separate program anyway.
    """
    return subprocess.run([sys.executable, "-m", "analytics", *argv], check=False).returncode


def _sim_main(argv: list[str]) -> int:
    from transport.sim import main as sim_main

    return sim_main(argv, prog="megnode simulate")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASS_THROUGH:
        return PASS_THROUGH[argv[0]](argv[1:])
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    # `publish TOPIC --binary MESSAGE`: argparse has passed the optional MESSAGE by
    # when it meets the option; the one word left over is that message.
    if (extras and getattr(args, "func", None) is cmd_publish and args.message is None
            and len(extras) == 1 and not extras[0].startswith("-")):
        args.message, extras = extras[0], []
    if extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    try:
        return args.func(args)
    except UserError as exc:
        print(f"megnode: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
