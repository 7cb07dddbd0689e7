"""A damaged, missing or exposed data dir: real `megnode run` processes refuse it in one line.

One seed data dir (a topic, a few hundred events) is built once by a real
daemon under umask 022; each test copies it, applies one fault and runs
`megnode run` on the copy. What is asserted is the property a user sees:
exit status 2, one line on stderr naming the problem, no traceback, and
never a SIGBUS (-7) from mapping a truncated file. docs/store.md.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploy.cluster import megnode_command
from tests.helpers import mounted_tmpfs

LISTEN = "/ip4/127.0.0.1/tcp/0"
START_TIMEOUT_S = 30.0  # a refused start ends long before; a started one prints a line
STOP_TIMEOUT_S = 20.0
CLI_TIMEOUT_S = 30.0
SEED_EVENTS = 300  # enough for a store of many pages (8 KiB is well inside it)
SCATTER_WRITES = 200
SCATTER_BYTES = 16
FAULT_SEED = 17
DISK_FULL_TMPFS = "3m"
DISK_FULL_LINE = "x" * 1_500
DISK_FULL_LINES_PER_PUBLISH = 500
MAX_PUBLISHES_TO_FILL = 20


def _umask_022() -> None:
    os.umask(0o022)


def start(data_dir: Path, *extra: str, stderr_path: Path) -> subprocess.Popen[str]:
    with open(stderr_path, "w") as stderr:  # a file: a pipe nobody reads could block the daemon
        return subprocess.Popen(megnode_command("run", "--data-dir", str(data_dir), "--listen",
                                                LISTEN, *extra),
                                stdout=subprocess.PIPE, stderr=stderr, text=True,
                                preexec_fn=_umask_022)


def started(process: subprocess.Popen[str]) -> bool:
    """True once the daemon printed its started line; False if it exited first."""
    assert process.stdout is not None
    line = process.stdout.readline()  # bounded: the daemon prints it or exits
    return line.startswith('{"event":"started"')


def stop(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=STOP_TIMEOUT_S)


def cli(data_dir: Path, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(megnode_command(*args, "--data-dir", str(data_dir)), capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S, input=input_text)


def assert_one_line(returncode: int, stderr: str, *words: str) -> None:
    assert returncode != -signal.SIGBUS, "the daemon died of SIGBUS"
    assert returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert "internal error" not in stderr and "AssertionError" not in stderr, stderr
    assert all(word in stderr for word in words), stderr


def run_refused(data_dir: Path, tmp_path: Path, *words: str, extra: tuple[str, ...] = ()) -> None:
    stderr_path = tmp_path / "stderr"
    process = start(data_dir, *extra, stderr_path=stderr_path)
    try:
        returncode = process.wait(timeout=START_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert_one_line(returncode, stderr_path.read_text(), *words)


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A stopped node's data dir holding a topic of SEED_EVENTS events, and the topic id."""
    base = tmp_path_factory.mktemp("seed")
    data_dir = base / "node"
    process = start(data_dir, stderr_path=base / "stderr")
    try:
        assert started(process), (base / "stderr").read_text()
        result = cli(data_dir, "topic", "create", "faults")
        assert result.returncode == 0, result.stderr
        topic = json.loads(result.stdout)["topic"]
        lines = "\n".join(f"event {i}" for i in range(SEED_EVENTS))
        result = cli(data_dir, "publish", topic, "-", "--lines", input_text=lines)
        assert result.returncode == 0, result.stderr
    finally:
        assert stop(process) == 0, (base / "stderr").read_text()
    return data_dir, topic


@pytest.fixture
def node_copy(seed: tuple[Path, str], tmp_path: Path) -> Path:
    copy = tmp_path / "node"
    shutil.copytree(seed[0], copy)
    return copy


def _data_file(data_dir: Path) -> Path:
    return data_dir / "store" / "data.mdb"


def _truncate_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _truncate_8k(path: Path) -> None:
    assert path.stat().st_size > 8192
    os.truncate(path, 8192)


def _zero_first_8k(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.write(bytes(8192))


def _randomise_second_half(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(size // 2)
        handle.write(random.Random(FAULT_SEED).randbytes(size - size // 2))


FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated to half": (_truncate_half, "truncated"),
    "truncated to 8 KiB": (_truncate_8k, "truncated"),
    "truncated to 0 bytes": (lambda path: os.truncate(path, 0), "missing or empty"),
    "first 8 KiB zeroed": (_zero_first_8k, "no LMDB magic"),
    "second half random": (_randomise_second_half, "damaged"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_store_is_refused_in_one_line(fault: str, node_copy: Path,
                                                tmp_path: Path) -> None:
    damage, word = FAULTS[fault]
    damage(_data_file(node_copy))
    run_refused(node_copy, tmp_path, word, str(node_copy / "store"))


def test_scattered_overwrites_give_one_line_errors_never_an_assertion(
        seed: tuple[Path, str], node_copy: Path, tmp_path: Path) -> None:
    """200 x 16 random bytes: the start may be refused, or later requests fail clearly."""
    path = _data_file(node_copy)
    size = path.stat().st_size
    rng = random.Random(FAULT_SEED)
    with open(path, "r+b") as handle:
        for _ in range(SCATTER_WRITES):
            handle.seek(rng.randrange(size - SCATTER_BYTES))
            handle.write(rng.randbytes(SCATTER_BYTES))
    stderr_path = tmp_path / "stderr"
    process = start(node_copy, stderr_path=stderr_path)
    try:
        if not started(process):
            assert_one_line(process.wait(timeout=START_TIMEOUT_S), stderr_path.read_text(),
                            str(node_copy / "store"))
            return
        for args in (("status",), ("publish", seed[1], "after the damage")):
            result = cli(node_copy, *args)
            if result.returncode != 0:
                # One line, never an assertion. Damage is named as such
                # ("damaged", DamagedTopicError); a bug would still come as an
                # "internal error: <type>: <message>" line (docs/store.md).
                # 6 (topic not found) when the damage took the topic's record itself,
                # 7 (not allowed: "not a joined member") when it took the node's
                # membership record (the store's layout follows the seed's random keys,
                # so where the fixed overwrites land differs from run to run).
                assert result.returncode in (2, 6, 7), result.stderr
                assert len(result.stderr.strip().splitlines()) == 1, result.stderr
                assert "Traceback" not in result.stderr, result.stderr
                assert "AssertionError" not in result.stderr, result.stderr
    finally:
        if process.poll() is None:
            assert stop(process) == 0, stderr_path.read_text()


def test_reinit_starts_a_node_whose_store_is_lost(node_copy: Path, tmp_path: Path) -> None:
    shutil.rmtree(node_copy / "store")
    run_refused(node_copy, tmp_path, "--reinit", "has run before")
    process = start(node_copy, "--reinit", stderr_path=tmp_path / "stderr")
    try:
        assert started(process), (tmp_path / "stderr").read_text()
    finally:
        assert stop(process) == 0, (tmp_path / "stderr").read_text()


def test_a_lost_key_with_an_existing_store_is_refused(node_copy: Path, tmp_path: Path) -> None:
    (node_copy / "node.key").unlink()
    run_refused(node_copy, tmp_path, "node.key", "missing", "has run before")
    assert not (node_copy / "node.key").exists(), "a new identity was made for an old store"


def test_the_data_dir_is_private_whatever_the_umask(seed: tuple[Path, str]) -> None:
    """The seed node ran under umask 022: its dir is 0700 and nothing in it is for others."""
    data_dir = seed[0]
    assert data_dir.stat().st_mode & 0o777 == 0o700
    for root, dirs, files in os.walk(data_dir):
        for name in dirs + files:
            mode = (Path(root) / name).stat().st_mode
            assert mode & 0o077 == 0, f"{Path(root) / name} has mode {oct(mode & 0o777)}"


def test_a_data_dir_others_can_write_is_refused(tmp_path: Path) -> None:
    """(A group-writable dir, a deleted store: tests/storage/test_store_open.py, in-process.)"""
    data_dir = tmp_path / "open"
    data_dir.mkdir()
    data_dir.chmod(0o777)
    run_refused(data_dir, tmp_path, "writable by other users", "chmod 700")
    assert not (data_dir / "node.key").exists()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tmpfs", DISK_FULL_TMPFS) as mount_point:
        yield mount_point


def test_disk_full_is_one_line_reads_still_work_and_sigterm_exits_0(
        small_tmpfs: Path, tmp_path: Path) -> None:
    data_dir = small_tmpfs / "node"
    stderr_path = tmp_path / "stderr"
    process = start(data_dir, stderr_path=stderr_path)
    try:
        assert started(process), stderr_path.read_text()
        result = cli(data_dir, "topic", "create", "fills the disk")
        assert result.returncode == 0, result.stderr
        topic = json.loads(result.stdout)["topic"]
        lines = "\n".join([DISK_FULL_LINE] * DISK_FULL_LINES_PER_PUBLISH)
        for _ in range(MAX_PUBLISHES_TO_FILL):
            result = cli(data_dir, "publish", topic, "-", "--lines", input_text=lines)
            if result.returncode != 0:
                break
        assert_one_line(result.returncode, result.stderr, "disk full: no space left on",
                        "the last batch was not stored; reads still work")
        assert cli(data_dir, "status").returncode == 0
        result = cli(data_dir, "subscribe", topic, "--kinds", "message,state,ack",
                     "--count", "3")
        assert result.returncode == 0 and len(result.stdout.splitlines()) == 3, result.stderr
    finally:
        if process.poll() is None:
            assert stop(process) == 0, stderr_path.read_text()
