"""The `megnode` CLI's user surface: errors and exit statuses, publish, subscribe, topic
views, and the help every command prints.

Kept apart from `node.cli` (the command table and the daemon's own commands) so
what a user meets when something goes wrong reads in one place: every failure
is one line on stderr (`megnode: ...`) and an exit status by kind (EXIT_CODES,
docs/control.md "Exit statuses"); stdout carries only JSON results. Standard
library only (plus the payload limit): commands answer without loading trio or
libp2p.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import select
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from node.control_client import (CONTROL_SOCKET, DAEMON_GONE, ControlError, control_call,
                                 control_lines)
from node.core.event import MAX_PAYLOAD_BYTES

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # a mistake in the command line, or a refusal of no kind below
# Exit statuses by kind of failure: a script tells a mistake to fix from a daemon
# to restart. The keys are the control socket's error codes (node.errors `code`,
# node.control_client.DAEMON_GONE).
EXIT_DAEMON_GONE = 3  # no daemon running, or it went away during the command
EXIT_TOO_LARGE = 4  # a payload over MAX_PAYLOAD_BYTES
EXIT_ENCODING = 5  # not UTF-8 text (give --binary), not base64 (--base64)
EXIT_TOPIC_NOT_FOUND = 6  # not replicated here; a join no peer let in
EXIT_NOT_ALLOWED = 7  # not a joined member, not a writer, banned
EXIT_TIMEOUT = 8  # `topic join --wait` did not see this node joined in time
EXIT_TOPIC_LEFT = 9  # a subscription ended because the topic was left here
EXIT_CODES = {DAEMON_GONE: EXIT_DAEMON_GONE, "payload_too_large": EXIT_TOO_LARGE,
              "encoding": EXIT_ENCODING, "topic_not_found": EXIT_TOPIC_NOT_FOUND,
              "not_allowed": EXIT_NOT_ALLOWED, "banned": EXIT_NOT_ALLOWED,
              "timeout": EXIT_TIMEOUT, "topic_left": EXIT_TOPIC_LEFT}
DEFAULT_DATA_DIR = "megnode-data"
# `publish --lines`: a batch goes out when it holds PUBLISH_BATCH lines or
# PUBLISH_BATCH_BYTES of encoded payloads (under the control socket's 1 MiB request
# line), or when the input has been quiet for PUBLISH_LINGER_S: a sensor pipe's
# lines are stored as they come, not when the pipe closes.
PUBLISH_BATCH = 1_000
PUBLISH_BATCH_BYTES = 512 * 1024
PUBLISH_LINGER_S = 0.2
READ_CHUNK = 65_536
JOIN_WAIT_S = 10.0  # `topic join --wait`: default bound
CONTROL_SLACK_S = 30.0  # a waiting request's client timeout: the daemon's bound plus this
SUBSCRIBE_KINDS = ("message", "state", "ack")  # node.topic_handle.EVENT_CLASSES


class UserError(Exception):
    """A mistake the user can fix (or a failure to report); printed as one line.

    `code` (a control socket error code) picks the exit status (EXIT_CODES)."""

    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code

    @property
    def exit_status(self) -> int:
        return EXIT_CODES.get(self.code, EXIT_USAGE)


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir)


def _socket(args: argparse.Namespace) -> Path:
    return _data_dir(args) / CONTROL_SOCKET


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, separators=(",", ":")), flush=True)


def _control(args: argparse.Namespace, request: dict[str, Any],
             timeout_s: float = 30.0) -> dict[str, Any]:
    try:
        return control_call(_socket(args), request, timeout_s=timeout_s)
    except ControlError as exc:
        raise UserError(str(exc), exc.code) from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3_600:
        raise argparse.ArgumentTypeError(f"a number of seconds in (0, 3600], not {text!r}")
    return value


# ---------------------------------------------------------------------- payloads


class PayloadError(UserError):
    """One payload that cannot be published: too large, not text, not base64."""


def _payload(raw: bytes, args: argparse.Namespace, what: str) -> bytes:
    """The bytes to publish for `raw` input, checked: decoded (--base64), UTF-8 (default)."""
    if args.base64:
        try:
            raw = base64.b64decode(b"".join(raw.split()), validate=True)
        except (binascii.Error, ValueError):
            raise PayloadError(f"{what} is not valid base64", "encoding") from None
    elif not args.binary:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadError(f"{what} is not UTF-8 text (byte {exc.start + 1}); publish "
                               f"bytes with --binary, or give them as --base64", "encoding"
                               ) from None
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"{what} is {len(raw)} bytes, over the limit of {MAX_PAYLOAD_BYTES} "
                           f"bytes per event (MAX_PAYLOAD_BYTES)", "payload_too_large")
    return raw


def _wire(payload: bytes, as_text: bool) -> str:
    """A payload as the control request carries it: text, or base64 for bytes."""
    return payload.decode("utf-8") if as_text else base64.b64encode(payload).decode("ascii")


def _input(args: argparse.Namespace) -> BinaryIO:
    """Where the payloads come from: --file, or stdin (MESSAGE "-", or --lines alone)."""
    if args.file is not None and args.file != "-":
        try:
            return open(args.file, "rb")  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            raise UserError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    return sys.stdin.buffer


def publish_command(args: argparse.Namespace) -> int:
    if args.binary and args.base64:
        raise UserError("give --binary or --base64, not both")
    if args.file is not None and args.message is not None:
        raise UserError("give a MESSAGE or --file, not both")
    reads_input = args.file is not None or args.message == "-" or args.lines
    if args.lines and args.message not in (None, "-"):
        raise UserError("--lines reads its messages from stdin or --file, not the argument")
    if not reads_input and args.message is None:
        raise UserError('give a MESSAGE, "-" to read stdin, or --file FILE')
    if args.lines:
        source = _input(args)
        try:
            return _publish_lines(args, source)
        finally:
            if source is not sys.stdin.buffer:
                source.close()
    if reads_input:
        source = _input(args)
        try:
            raw = source.read()
        finally:
            if source is not sys.stdin.buffer:
                source.close()
    else:  # the argument: the shell's bytes, as Python decoded them (surrogateescape)
        raw = os.fsencode(args.message)
    payload = _payload(raw, args, "the message")
    as_text = not (args.binary or args.base64)
    request = {"op": "publish", "topic": args.topic}
    request["payload" if as_text else "payload_b64"] = _wire(payload, as_text)
    _print_json({"id": _control(args, request)["id"]})
    return EXIT_OK


@dataclass(frozen=True)
class _Batch:
    first: int  # line numbers, from 1
    payloads: list[bytes]

    @property
    def last(self) -> int:
        return self.first + len(self.payloads) - 1


class _BadLine(Exception):
    """A line that cannot be published: the lines before it go out, then this is reported."""

    def __init__(self, number: int, error: PayloadError) -> None:
        super().__init__(str(error))
        self.number = number
        self.error = error


def _batches(source: BinaryIO, args: argparse.Namespace) -> Iterator[_Batch]:
    """Lines of `source` in bounded batches, sent as they come (module constants).

    A batch is cut when full, or when the input is quiet for PUBLISH_LINGER_S; a bad
    line ends the input: the lines before it come as a last batch, then _BadLine.
    """
    fd = source.fileno()
    as_text = not (args.binary or args.base64)
    pending = b""
    batch: list[bytes] = []
    size = 0
    first = number = 1
    eof = False
    while not eof:
        if batch:  # something to send: wait for more only briefly
            readable, _, _ = select.select([fd], [], [], PUBLISH_LINGER_S)
            if not readable:
                yield _Batch(first, batch)
                first, batch, size = number, [], 0
                continue
        chunk = os.read(fd, READ_CHUNK)
        if chunk:
            pending += chunk
            *lines, pending = pending.split(b"\n")
        else:
            eof = True
            lines, pending = ([pending] if pending else []), b""
        for line in lines:
            try:
                payload = _payload(line, args, f"line {number}")
            except PayloadError as exc:
                if batch:
                    yield _Batch(first, batch)
                raise _BadLine(number, exc) from None
            cost = len(_wire(payload, as_text)) + 8  # JSON quotes, comma, escapes' slack
            if batch and (len(batch) >= PUBLISH_BATCH or size + cost > PUBLISH_BATCH_BYTES):
                yield _Batch(first, batch)
                first, batch, size = number, [], 0
            batch.append(payload)
            size += cost
            number += 1
        if len(pending) > 2 * MAX_PAYLOAD_BYTES + 1:  # a line past any limit: say so now
            try:
                _payload(pending, args, f"line {number}")
            except PayloadError as exc:
                if batch:
                    yield _Batch(first, batch)
                raise _BadLine(number, exc) from None
    if batch:
        yield _Batch(first, batch)


def _stored(upto: int) -> str:
    return "nothing stored" if upto < 1 else f"lines 1-{upto} stored"


def _publish_lines(args: argparse.Namespace, source: BinaryIO) -> int:
    """`publish --lines`: each batch all stored or none; a JSON line per stored batch."""
    as_text = not (args.binary or args.base64)
    field = "payloads" if as_text else "payloads_b64"
    stored = 0
    last: str | None = None
    progress = sys.stderr.isatty()
    try:
        for batch in _batches(source, args):
            request = {"op": "publish_batch", "topic": args.topic,
                       field: [_wire(p, as_text) for p in batch.payloads]}
            try:
                ids = control_call(_socket(args), request)["ids"]
            except ControlError as exc:
                span = f"lines {batch.first}-{batch.last}"
                if exc.code == DAEMON_GONE and exc.sent:
                    raise UserError(f"the daemon went away while storing {span}: they may or "
                                    f"may not be stored; {_stored(stored)} ({exc})", DAEMON_GONE
                                    ) from None
                raise UserError(f"{span} not stored: {exc}; {_stored(stored)}", exc.code
                                ) from None
            stored, last = batch.last, ids[-1]
            _print_json({"lines": [batch.first, batch.last], "published": len(ids),
                         "last": last})
            if progress:
                print(f"\rmegnode: {stored} lines published", end="", file=sys.stderr,
                      flush=True)
    except _BadLine as bad:
        raise UserError(f"{bad.error}; {_stored(stored)}, line {bad.number} and after not "
                        f"published", bad.error.code) from None
    finally:
        if progress:
            print(file=sys.stderr)
    _print_json({"published": stored, "last": last})
    return EXIT_OK


def add_publish_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    p.add_argument("message", nargs="?",
                   help='the message text, or "-" to read it from stdin')
    p.add_argument("--file", metavar="FILE",
                   help='read the message (with --lines: the messages) from FILE ("-": stdin)')
    p.add_argument("--lines", action="store_true",
                   help="publish each line of stdin (or --file) as its own event, streamed in "
                        f"batches of at most {PUBLISH_BATCH} lines as they are read; each batch "
                        "is stored whole or not at all, and a JSON line reports each")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--binary", action="store_true",
                      help="publish the bytes as they are (without it they must be UTF-8 text)")
    form.add_argument("--base64", action="store_true",
                      help="the message (each line) is base64: publish the bytes it encodes")


# ---------------------------------------------------------------------- subscribe


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in SUBSCRIBE_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"kinds are a comma-separated list of "
                                         f"{', '.join(SUBSCRIBE_KINDS)}, not {text!r}")
    return kinds


def _since(text: str) -> int | str:
    if text.isdigit():
        return int(text)
    try:
        if len(bytes.fromhex(text)) == 32:
            return text.lower()
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"a cursor (a number, as printed) or an event id "
                                     f"(64 hex), not {text!r}")


def subscribe_command(args: argparse.Namespace) -> int:
    """Stream the topic's events as JSON lines on stdout; every failure one stderr line."""
    request = {"op": "subscribe", "topic": args.topic, "since": args.since, "count": args.count,
               "order": args.order, "kinds": args.kinds,
               "payload": "base64" if args.base64 else "text"}
    events = 0
    try:
        replies = control_lines(_socket(args), request, timeout_s=None)
        first = next(replies, None)
        if first is None:
            raise UserError("the daemon went away before the subscription started",
                            DAEMON_GONE)
        if not first.get("ok"):
            raise UserError(first.get("error", "the daemon refused to subscribe"),
                            str(first.get("code", "error")))
        for reply in replies:
            if reply.get("ok") is False:  # the node ended it: topic left, banned
                raise UserError(f"subscription ended after {events} events: "
                                f"{reply.get('error')}", str(reply.get("code", "error")))
            _print_json(reply)
            events += "id" in reply
    except ControlError as exc:
        raise UserError(str(exc), exc.code) from None
    except (KeyboardInterrupt, BrokenPipeError):
        return EXIT_OK
    if args.count is None or events < args.count:
        raise UserError(f"the daemon went away (subscription ended after {events} events)",
                        DAEMON_GONE)
    return EXIT_OK


def add_subscribe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    p.add_argument("--kinds", type=_kinds, default=["message"], metavar="KINDS",
                   help="which events, comma-separated: message (what applications publish), "
                        "state (members, roles, set-state), ack (the indexers' empty events) "
                        "(default: message)")
    p.add_argument("--since", type=_since, default=0, metavar="CURSOR|EVENT_ID",
                   help="start at this cursor (each line prints one: the position after it) "
                        "or just after this event id (default: 0, the beginning)")
    p.add_argument("--count", type=int, default=None,
                   help="stop after this many events (default: never)")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--order", choices=("causal", "confirmed", "tentative"), default="causal",
                       help="causal: every event, parents first; confirmed: the quorum-confirmed "
                            "total order (positions never change); tentative: the full order, "
                            'which may reorder: a line {"rewind": n} drops the lines from '
                            "position n on, the next lines replay from there")
    for name in ("causal", "confirmed", "tentative"):
        order.add_argument(f"--{name}", dest="order", action="store_const", const=name,
                           help=f"the same as --order {name}")
    p.add_argument("--base64", action="store_true",
                   help='every payload as "payload_b64" (default: "payload" text when it is '
                        'UTF-8, else "payload_b64")')


# ---------------------------------------------------------------------- topic views

TOPIC_VIEW_COMMANDS = {"list": "topic_list", "members": "topic_members", "info": "topic_info"}


def cmd_topic_view(args: argparse.Namespace) -> int:
    request: dict[str, Any] = {"op": TOPIC_VIEW_COMMANDS[args.topic_command]}
    if args.topic_command != "list":
        request["topic"] = args.topic
    reply = _control(args, request)
    reply.pop("ok", None)
    print(json.dumps(reply, indent=2))
    return EXIT_OK


def add_topic_view_parsers(topic_commands: Any, with_data_dir: Any) -> None:
    with_data_dir(topic_commands.add_parser("list", help="the topics this node replicates"))
    q = with_data_dir(topic_commands.add_parser(
        "members", help="a topic's members: node id, membership, role"))
    q.add_argument("topic")
    q = with_data_dir(topic_commands.add_parser(
        "info", help="a topic's status, access, member counts and the connected peers in it"))
    q.add_argument("topic")


# ---------------------------------------------------------------------- help

T = "<topic id>"
EXAMPLES = {
    "megnode": "megnode run --data-dir D &\n  megnode topic create kitchen --data-dir D",
    "megnode keygen": "megnode keygen --data-dir ~/.megnode",
    "megnode run": "megnode run --data-dir ~/.megnode --listen /ip4/0.0.0.0/tcp/4001",
    "megnode topic": "megnode topic create kitchen --data-dir D",
    "megnode topic create": "megnode topic create kitchen --access invite --data-dir D",
    "megnode topic state": f"megnode topic state {T} --data-dir D",
    "megnode topic set-state": f"megnode topic set-state {T} app.config '' '{{\"unit\": \"C\"}}' "
                               "--data-dir D",
    "megnode topic invite": f"megnode topic invite {T} <node id> --data-dir D",
    "megnode topic add-writer": f"megnode topic add-writer {T} <node id> --data-dir D",
    "megnode topic ban": f"megnode topic ban {T} <node id> --data-dir D",
    "megnode topic set-role": f"megnode topic set-role {T} <node id> indexer --data-dir D",
    "megnode topic join": f"megnode topic join {T} --wait --timeout 30 --data-dir D",
    "megnode topic leave": f"megnode topic leave {T} --data-dir D",
    "megnode topic list": "megnode topic list --data-dir D",
    "megnode topic members": f"megnode topic members {T} --data-dir D",
    "megnode topic info": f"megnode topic info {T} --data-dir D",
    "megnode publish": f"megnode publish {T} '21.5C' --data-dir D\n"
                       f"  sensor | megnode publish {T} --lines --data-dir D\n"
                       f"  megnode publish {T} --file photo.jpg --binary --data-dir D",
    "megnode subscribe": f"megnode subscribe {T} --kinds message,state --since 42 --data-dir D",
    "megnode relay-publish": f"megnode relay-publish {T} '21.5C' --key device.key "
                             "--relay /ip4/192.0.2.10/tcp/4001/p2p/12D3Koo...",
    "megnode status": "megnode status --data-dir D",
    "megnode peers": "megnode peers --data-dir D",
    "megnode connect": "megnode connect /ip4/192.0.2.10/tcp/4001/p2p/12D3Koo... --data-dir D",
    "megnode export-logs": "megnode export-logs out/ --data-dir D",
    "megnode check": "megnode check --data-dir D",
    "megnode repair": f"megnode repair {T} --data-dir D",
    "megnode backup": "megnode backup /backups/2026-11-25 --data-dir D",
    "megnode restore": "megnode restore /backups/2026-11-25 --data-dir D",
    "megnode analyze": "megnode analyze logs/ --out report/",
    "megnode simulate": "megnode simulate --seed 1 --nodes 50",
}
EXIT_STATUS_HELP = ("exit status: 0 done, 1 failure, 2 usage or refused, 3 no daemon / it went "
                    "away, 4 payload too large, 5 not UTF-8 / not base64, 6 topic not found, "
                    "7 not a member / not a writer / banned, 8 timed out, 9 topic left "
                    "(docs/control.md)")


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error style: one `megnode: ...` line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("megnode").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"megnode: {where}{message} (see `{self.prog} --help`)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Options' help with their defaults (those that have one worth saying)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default in (None, False, argparse.SUPPRESS)
                or not action.option_strings):
            return text
        shown = ",".join(default) if isinstance(default, list) else "%(default)s"
        return f"{text} (default: {shown})"


def subparsers_of(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps the subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield sub
                yield from subparsers_of(sub)


def finish_help(parser: argparse.ArgumentParser) -> None:
    """Every command's --help: named `megnode ...`, defaults shown, an example, exit statuses."""
    for p in (parser, *subparsers_of(parser)):
        p.formatter_class = HelpFormatter
        example = EXAMPLES.get(p.prog)
        p.epilog = (f"example:\n  {example}\n\n" if example else "") + EXIT_STATUS_HELP
