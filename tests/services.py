"""Real PostgreSQL, MariaDB and Redis servers for the test session, restartable for crash tests.

PostgreSQL comes from the standard ``PG*`` environment variables when ``PGHOST``
is set (each session gets a fresh database there); otherwise a throwaway cluster
is created in a temporary directory. MariaDB is always a throwaway local server
(``PYPEPPER_TEST_MYSQL_URI`` replaces it, see ``conftest.py``), and Redis a
local ``redis-server`` unless ``PYPEPPER_TEST_REDIS_URL`` names one (a container for
tox, say: :class:`ExternalRedis`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy.engine import URL


class ServiceError(RuntimeError):
    """A test service could not be started."""


def _ephemeral_ports() -> range:
    """The ports the kernel hands to outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to right now, outside the ephemeral range.

    A server the crash tests stop and start again keeps its port. Were it an ephemeral
    port, an outgoing connection made while the server is down could take it (a client
    retrying ``127.0.0.1:port`` can even connect to itself) and the restart would fail
    with the port in use, as a RabbitMQ node's once did in CI.
    """
    ephemeral = _ephemeral_ports()
    candidates = [p for p in range(20000, 32768) if p not in ephemeral]
    if not candidates:
        candidates = [p for p in range(1024, 65536) if p not in ephemeral]
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServiceError("no free TCP port on 127.0.0.1 outside the ephemeral range")


def end_process(proc: subprocess.Popen[Any] | None, *, kill: bool, timeout: float) -> None:
    """SIGTERM (or SIGKILL with ``kill``) a server process and wait; SIGKILL if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    if kill:
        proc.kill()
    else:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def find_binary(name: str, package: str, extra_dirs: Sequence[str] = ()) -> str:
    """The path of ``name``, or a :class:`ServiceError` naming the Debian package."""
    found = shutil.which(name)
    if found:
        return found
    for directory in extra_dirs:
        candidate = Path(directory, name)
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise ServiceError(
        f"`{name}` not found on PATH; install the Debian package `{package}` "
        f"(apt-get install {package}) or run scripts/test as root to have it installed"
    )


def _run(cmd: Sequence[str], *, cwd: Path | None = None, timeout: float = 120) -> None:
    proc = subprocess.run(
        list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise ServiceError(
            f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}".strip()
        )


# -- PostgreSQL -----------------------------------------------------------------------------


def _pg_bin_dirs() -> list[str]:
    # Debian keeps initdb and pg_ctl out of PATH, under /usr/lib/postgresql/<major>/bin.
    return sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)


class PostgresServer:
    """A PostgreSQL server: a throwaway local cluster, or the one ``PG*`` points at.

    Args:
        tmpdir: where the local cluster lives (its data directory survives restarts).
        database: the database the tests use; created on first start.
    """

    def __init__(self, tmpdir: Path | str, database: str = "pypepper_test") -> None:
        self.external = bool(os.environ.get("PGHOST"))
        self.database = database
        self.host = "127.0.0.1"
        self.port = 0
        self.user = "postgres"
        self.password: str | None = None
        self._tmpdir = Path(tmpdir)
        self._workdir: Path | None = None
        self._running = False
        if self.external:
            self.host = os.environ["PGHOST"]
            self.port = int(os.environ.get("PGPORT", "5432"))
            self.user = os.environ.get("PGUSER") or pwd.getpwuid(os.getuid()).pw_name
            self.password = os.environ.get("PGPASSWORD")
            self.database = f"{database}_{uuid.uuid4().hex[:8]}"

    def uri_for(self, database: str) -> str:
        """A ``postgresql+psycopg://`` URL for ``database`` on this server."""
        if self.host.startswith("/"):  # a unix socket directory
            url = URL.create(
                "postgresql+psycopg",
                username=self.user,
                password=self.password,
                database=database,
                query={"host": self.host, "port": str(self.port)},
            )
        else:
            url = URL.create(
                "postgresql+psycopg",
                username=self.user,
                password=self.password,
                host=self.host,
                port=self.port,
                database=database,
            )
        return url.render_as_string(hide_password=False)

    @property
    def uri(self) -> str:
        """The URL of the test database."""
        return self.uri_for(self.database)

    def start(self) -> None:
        """Start the server (creating the cluster and database the first time)."""
        if self._running:
            return
        if self.external:
            self.create_database(self.database)
        else:
            first = self._workdir is None
            if first:
                self._init_cluster()
            log = str(self._path("postgres.log"))
            self._pg_ctl("start", "-w", "-t", "60", "-l", log, "-o", self._options())
            if first:
                self.create_database(self.database)
        self._running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``mode="immediate"`` is a crash (no checkpoint)."""
        if not self._running:
            return
        self._running = False
        if self.external:
            self.drop_database(self.database)
        else:
            self._pg_ctl("stop", "-w", "-t", "60", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again on the same port and data directory."""
        if self.external:
            raise ServiceError("cannot restart the external PostgreSQL server named by PGHOST")
        self.stop(mode)
        self.start()

    def cleanup(self) -> None:
        """Stop the server and remove its files."""
        self.stop()
        if self._workdir is not None and not self.external:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """Create ``name`` (dropping any leftover) and return its URL."""
        self._admin(f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"')
        return self.uri_for(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting its clients."""
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, *statements: str) -> None:
        # Externally, libpq reads PGHOST, PGPORT, PGUSER and PGPASSWORD itself.
        params: dict[str, Any] = {"dbname": os.environ.get("PGDATABASE", "postgres")}
        if not self.external:
            params.update(host=self.host, port=self.port, user=self.user)
        try:
            conn = psycopg.connect(autocommit=True, connect_timeout=10, **params)
        except psycopg.Error as exc:
            raise ServiceError(f"cannot connect to PostgreSQL: {exc}") from exc
        with conn:
            for statement in statements:
                conn.execute(statement.encode())

    # -- the local cluster

    def _path(self, *parts: str) -> Path:
        assert self._workdir is not None
        return self._workdir.joinpath(*parts)

    def _as_postgres(self, cmd: Sequence[str]) -> list[str]:
        # postgres refuses to run as root: drop to the postgres user.
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *cmd]
        return list(cmd)

    def _pg_ctl(self, *args: str) -> None:
        pg_ctl = find_binary("pg_ctl", "postgresql", _pg_bin_dirs())
        cmd = self._as_postgres([pg_ctl, "-D", str(self._path("data")), *args])
        _run(cmd, cwd=self._workdir)

    def _options(self) -> str:
        return " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c port={self.port}",
                f"-c unix_socket_directories={self._path()}",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )

    def _init_cluster(self) -> None:
        initdb = find_binary("initdb", "postgresql", _pg_bin_dirs())
        find_binary("pg_ctl", "postgresql", _pg_bin_dirs())
        if os.geteuid() == 0:
            # pytest's temp dirs are private to root; postgres needs its own.
            workdir = Path(tempfile.mkdtemp(prefix="pypepper-pg-"))
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise ServiceError(
                    "running as root but there is no `postgres` user; install the "
                    "Debian package `postgresql` or run the tests as another user"
                ) from exc
            os.chown(workdir, entry.pw_uid, entry.pw_gid)
        else:
            workdir = Path(tempfile.mkdtemp(prefix="pg-", dir=self._tmpdir))
        self._workdir = workdir
        self.port = free_port()
        _run(
            self._as_postgres(
                [
                    initdb,
                    "-D",
                    str(self._path("data")),
                    "-A",
                    "trust",
                    "-U",
                    self.user,
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            ),
            cwd=workdir,
        )


def start_postgres(tmpdir: Path | str) -> tuple[str, Callable[[], None]]:
    """Start PostgreSQL; returns the test database's URL and a function that stops it."""
    server = PostgresServer(tmpdir)
    server.start()
    return server.uri, server.cleanup


# -- MariaDB --------------------------------------------------------------------------------

#: Debian puts the server in /usr/sbin, which is not on a normal user's PATH.
_SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin")


def _find_first(names: Sequence[str], package: str) -> str:
    """The first of ``names`` that is installed (MariaDB keeps the MySQL names as aliases)."""
    for name in names:
        with contextlib.suppress(ServiceError):
            return find_binary(name, package, _SBIN_DIRS)
    return find_binary(names[0], package, _SBIN_DIRS)  # raises, naming the package


class MariaDBServer:
    """A throwaway ``mariadbd`` on a free 127.0.0.1 port, its files in a temporary directory.

    Root logs in over TCP without a password; nothing from ``/etc/mysql`` is read,
    so an installed system instance (its port, socket, data directory) never
    interferes, and it is never started either.

    Args:
        tmpdir: where the server's directory is created (removed by :meth:`cleanup`).
        database: the database the tests use; created on first start.
    """

    def __init__(self, tmpdir: Path | str, database: str = "pypepper_test") -> None:
        self.database = database
        self.port = 0
        self._tmpdir = Path(tmpdir)
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        """The ``mysql+pymysql://`` URL of the test database."""
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{self.database}"

    def start(self, timeout: float = 60) -> None:
        """Start the server (creating the data directory and database the first time)."""
        if self._proc is not None:
            return
        mariadbd = _find_first(["mariadbd", "mysqld"], "mariadb-server")
        first = self._workdir is None
        if first:
            self._install()
        log = self._path("error.log")
        cmd = [mariadbd, "--no-defaults", *self._options(), f"--log-error={log}"]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._workdir
        )
        deadline = time.monotonic() + timeout
        while not self._accepts_connections():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop(kill=True)
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise ServiceError(f"mariadbd did not start on port {self.port}:\n{tail}")
            time.sleep(0.05)
        if first:
            self._admin(f"CREATE DATABASE IF NOT EXISTS `{self.database}`")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGTERM is a clean shutdown); ``kill=True`` is a crash."""
        proc, self._proc = self._proc, None
        end_process(proc, kill=kill, timeout=60)

    def restart(self, *, kill: bool = False) -> None:
        """Stop and start again on the same port and data directory."""
        self.stop(kill=kill)
        self.start()

    def cleanup(self) -> None:
        """Stop the server and remove its files."""
        self.stop()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _path(self, *parts: str) -> Path:
        assert self._workdir is not None
        return self._workdir.joinpath(*parts)

    def _options(self) -> list[str]:
        options = [
            f"--datadir={self._path('data')}",
            f"--socket={self._path('mariadbd.sock')}",
            f"--pid-file={self._path('mariadbd.pid')}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            "--skip-networking=0",
            "--skip-name-resolve",
            "--skip-log-bin",
            # Small and unsafe, like fsync=off for PostgreSQL: a test server starts
            # fast and its data does not need to survive a power cut.
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M",
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-doublewrite=0",
            "--max-connections=200",
        ]
        if os.geteuid() == 0:
            # mariadbd refuses to run as root unless told to.
            options.append("--user=root")
        return options

    def _install(self) -> None:
        install_db = _find_first(["mariadb-install-db", "mysql_install_db"], "mariadb-server")
        self._workdir = Path(tempfile.mkdtemp(prefix="mariadb-", dir=self._tmpdir))
        self.port = free_port()
        # The default authentication for root is the unix socket, which a TCP client
        # cannot use; "normal" gives root@localhost/127.0.0.1 an empty password.
        _run(
            [
                install_db,
                "--no-defaults",
                *self._options(),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            cwd=self._workdir,
        )

    def _connect(self) -> Any:
        # PyMySQL is imported here, not at the top: the benchmarks import this
        # module for PostgreSQL and Redis, and their extra does not install it.
        import pymysql

        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", connect_timeout=5, autocommit=True
        )

    def _accepts_connections(self) -> bool:
        import pymysql

        try:
            self._connect().close()
        except pymysql.Error:
            return False
        return True

    def _admin(self, *statements: str) -> None:
        import pymysql

        try:
            conn = self._connect()
        except pymysql.Error as exc:
            raise ServiceError(f"cannot connect to MariaDB: {exc}") from exc
        with conn, conn.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)


# -- Redis ----------------------------------------------------------------------------------


class RedisServer:
    """A local ``redis-server`` with its data in ``tmpdir``, restartable on the same port.

    Args:
        tmpdir: the server's working directory (append-only file, log).
        appendonly: keep an append-only file, so data survives a restart.
    """

    def __init__(self, tmpdir: Path | str, *, appendonly: bool = False) -> None:
        self.binary = find_binary("redis-server", "redis-server")
        self.dir = Path(tmpdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30) -> None:
        """Start the server and wait until it answers PING."""
        if self._proc is not None:
            return
        cmd = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--logfile",
            str(self.dir / "redis.log"),
            "--daemonize",
            "no",
        ]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir
        )
        deadline = time.monotonic() + timeout
        while not self._ping():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop(kill=True)
                log = self.dir / "redis.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise ServiceError(f"redis-server did not start on port {self.port}:\n{tail}")
            time.sleep(0.05)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server; ``kill=True`` sends SIGKILL (a crash)."""
        proc, self._proc = self._proc, None
        end_process(proc, kill=kill, timeout=30)

    def restart(self, *, kill: bool = False) -> None:
        """Stop and start again on the same port with the same data directory."""
        self.stop(kill=kill)
        self.start()

    def _ping(self) -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock,
        ):
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
        return False


#: The variable naming a Redis the session uses instead of starting its own.
REDIS_URL_VARIABLE = "PYPEPPER_TEST_REDIS_URL"


class ExternalRedis:
    """A Redis the test session did not start (``PYPEPPER_TEST_REDIS_URL``): used as it
    is, never stopped. Its database is flushed by the tests that need it empty.

    Args:
        url: its ``redis://`` URL.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    def start(self, timeout: float = 30) -> None:
        """Wait until it answers PING (a container may still be starting)."""
        client = redis.Redis.from_url(self.url, socket_connect_timeout=2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.RedisError as exc:
                    if time.monotonic() > deadline:
                        raise ServiceError(
                            f"the Redis of {REDIS_URL_VARIABLE} ({self.url}) does not answer: {exc}"
                        ) from exc
                time.sleep(0.2)
        finally:
            client.close()

    def stop(self, *, kill: bool = False) -> None:
        """Nothing: the session does not own this server."""


def external_redis_url() -> str | None:
    """``PYPEPPER_TEST_REDIS_URL`` if set (and not blank)."""
    return os.environ.get(REDIS_URL_VARIABLE, "").strip() or None


def start_redis(tmpdir: Path | str, appendonly: bool = False) -> tuple[str, Callable[[], None]]:
    """Start ``redis-server``; returns its URL and a function that stops it."""
    server = RedisServer(tmpdir, appendonly=appendonly)
    server.start()
    return server.url, server.stop


# -- RabbitMQ -------------------------------------------------------------------------------

#: Debian keeps the server's scripts here; the ones in /usr/sbin switch to the `rabbitmq`
#: user and use the system node's files.
_RABBITMQ_DIRS = ("/usr/lib/rabbitmq/bin",)


class RabbitMQServer:
    """A throwaway RabbitMQ node on free 127.0.0.1 ports, its files in a temporary directory.

    Nothing of the system service is used: its own node name, AMQP, distribution and
    epmd ports, data (mnesia), log, pid and feature-flag files, an empty plugin list and
    no configuration file. As root it runs as the ``rabbitmq`` user the package creates.
    Restartable on the same ports and data directory (durable queues and persistent
    messages survive a restart). The ``guest`` user may log in over 127.0.0.1.

    Args:
        tmpdir: where the node's directory is made when not root (as root a private
            directory under the system's temporary directory, owned by ``rabbitmq``).
    """

    def __init__(self, tmpdir: Path | str) -> None:
        self.server = find_binary("rabbitmq-server", "rabbitmq-server", _RABBITMQ_DIRS)
        self.ctl = find_binary("rabbitmqctl", "rabbitmq-server", _RABBITMQ_DIRS)
        self.node = f"pypepper-{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self._tmpdir = Path(tmpdir)
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self, timeout: float = 90) -> None:
        """Start the node and wait until it accepts AMQP connections."""
        if self._proc is not None:
            return
        if self._workdir is None:
            self._make_workdir()
        log = self._path("server.log")
        with open(log, "ab") as out:
            self._proc = subprocess.Popen(
                self._as_rabbitmq([self.server]),
                env=self._env(),
                cwd=self._workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._accepts_connections():
            exit_code = self._proc.poll()
            if exit_code is not None or time.monotonic() > deadline:
                self.stop(kill=True)
                raise ServiceError(
                    f"rabbitmq-server did not start on port {self.port} "
                    f"(exit code {exit_code}):\n{self._log_tail(log)}"
                )
            time.sleep(0.2)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the node (``rabbitmqctl stop``; ``kill=True`` is a crash) and its epmd."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if not kill and proc.poll() is None:
            with contextlib.suppress(ServiceError, subprocess.TimeoutExpired):
                self._ctl("stop", timeout=60)
        if kill and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
        end_process(proc, kill=True, timeout=30)
        # The Erlang VM runs in the node's process group; epmd daemonizes out of it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        self._kill_epmd()

    def restart(self, *, kill: bool = False) -> None:
        """Stop and start again on the same ports and data directory."""
        self.stop(kill=kill)
        self.start()

    def cleanup(self) -> None:
        """Stop the node and remove its files."""
        self.stop()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _path(self, *parts: str) -> Path:
        assert self._workdir is not None
        return self._workdir.joinpath(*parts)

    def _make_workdir(self) -> None:
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam("rabbitmq")
            except KeyError as exc:
                raise ServiceError(
                    "running as root but there is no `rabbitmq` user; install the "
                    "Debian package `rabbitmq-server` or run the tests as another user"
                ) from exc
            workdir = Path(tempfile.mkdtemp(prefix="pypepper-rabbitmq-"))
        else:
            workdir = Path(tempfile.mkdtemp(prefix="rabbitmq-", dir=self._tmpdir))
        self._workdir = workdir
        for name in ("mnesia", "log", "home"):
            self._path(name).mkdir()
        self._path("enabled_plugins").write_text("[].\n")
        if os.geteuid() == 0:
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def _as_rabbitmq(self, cmd: Sequence[str]) -> list[str]:
        # As root, the node (and rabbitmqctl, which needs its Erlang cookie) run as the
        # package's user, which owns the node's files.
        if os.geteuid() == 0:
            return ["runuser", "-u", "rabbitmq", "--", *cmd]
        return list(cmd)

    def _env(self) -> dict[str, str]:
        return dict(
            os.environ,
            HOME=str(self._path("home")),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_MNESIA_BASE=str(self._path("mnesia")),
            RABBITMQ_LOG_BASE=str(self._path("log")),
            RABBITMQ_CONFIG_FILE=str(self._path("no-config")),  # never created
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self._path("no-advanced.config")),
            RABBITMQ_CONF_ENV_FILE=str(self._path("no-env.conf")),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self._path("enabled_plugins")),
            RABBITMQ_PID_FILE=str(self._path("node.pid")),
            RABBITMQ_FEATURE_FLAGS_FILE=str(self._path("feature_flags")),
        )

    def _ctl(self, *args: str, timeout: float = 60) -> None:
        cmd = self._as_rabbitmq([self.ctl, "-n", self.node, *args])
        proc = subprocess.run(
            cmd,
            env=self._env(),
            cwd=self._workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise ServiceError(
                f"rabbitmqctl {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
            )

    def _kill_epmd(self) -> None:
        """End the epmd this node started (the one listening on its own epmd port)."""
        port = f"{self.epmd_port}"
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                argv = cmdline.read_bytes().split(b"\0")
                environ = Path(cmdline.parent, "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if not argv or not argv[0].endswith(b"epmd"):
                continue
            if f"ERL_EPMD_PORT={port}".encode() in environ:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(cmdline.parent.name), 9)

    def _log_tail(self, stdout_log: Path) -> str:
        """The last lines the node wrote: its stdout, then its own log (``log/<node>.log``)."""
        parts = []
        for path in (stdout_log, self._path("log", f"{self.node}.log")):
            if path.exists():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def _accepts_connections(self) -> bool:
        # An AMQP 0-9-1 handshake: the node answers the protocol header with
        # Connection.Start once its listener runs (the TCP port opens a bit earlier).
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock,
        ):
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return len(sock.recv(8)) > 0 and self._ctl_ok("await_startup")
        return False

    def _ctl_ok(self, *args: str) -> bool:
        try:
            self._ctl(*args, "--timeout", "30", timeout=60)
        except (ServiceError, subprocess.TimeoutExpired):
            return False
        return True


#: The variable naming a RabbitMQ the session uses instead of starting its own.
RABBITMQ_URL_VARIABLE = "PYPEPPER_TEST_RABBITMQ_URL"


class ExternalRabbitMQ:
    """A RabbitMQ the test session did not start (``PYPEPPER_TEST_RABBITMQ_URL``): used as
    it is, never stopped. The tests purge the queues they use.

    Args:
        url: its ``amqp://`` URL.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    def start(self, timeout: float = 30) -> None:
        """Wait until it accepts a connection (a container may still be starting)."""
        import pika

        deadline = time.monotonic() + timeout
        while True:
            try:
                pika.BlockingConnection(pika.URLParameters(self.url)).close()
                return
            except pika.exceptions.AMQPError as exc:
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"the RabbitMQ of {RABBITMQ_URL_VARIABLE} ({self.url}) does not answer: "
                        f"{exc!r}"
                    ) from exc
            time.sleep(0.5)

    def stop(self, *, kill: bool = False) -> None:
        """Nothing: the session does not own this server."""

    def cleanup(self) -> None:
        """Nothing: the session does not own this server."""


def external_rabbitmq_url() -> str | None:
    """``PYPEPPER_TEST_RABBITMQ_URL`` if set (and not blank)."""
    return os.environ.get(RABBITMQ_URL_VARIABLE, "").strip() or None
