"""A throwaway PostgreSQL cluster for tests: Debian's server binaries, a temp data directory,
a free TCP port on 127.0.0.1 with password (scram) authentication, the unix socket inside the
temp directory, stopped and removed at the end.

PostgreSQL refuses to run as root; when the tests do, the server runs as `nobody` (through
runuser) in a directory owned by it. No shell is involved anywhere.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support.net import free_port

SUPERUSER = "trainwatch"


def server_bin() -> Path | None:
    """Newest installed server's bin directory (Debian: /usr/lib/postgresql/<v>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


class PgCluster:
    """initdb + pg_ctl start; `database()` makes a fresh database for one test."""

    def __init__(self) -> None:
        bindir = server_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL server not installed (apt-get install postgresql)")
        self.bindir = bindir
        self.base = Path(tempfile.mkdtemp(prefix="trainwatch-pg-"))
        self.data = self.base / "data"
        self.port = free_port()
        self.password = secrets.token_urlsafe(24)
        self._names = itertools.count(1)
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("nobody")
            os.chown(self.base, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "nobody", "--"]
        pwfile = self.base / "initdb.pw"
        pwfile.write_text(self.password)
        pwfile.chmod(0o600)
        if self._as:
            os.chown(pwfile, pwd.getpwnam("nobody").pw_uid, -1)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "-E", "UTF8",
                  "--auth=scram-sha-256", f"--pwfile={pwfile}", "--no-sync")
        pwfile.unlink()
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.base}'\n"
                       "max_connections = 200\nshared_buffers = 16MB\n")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self._as, str(self.bindir / tool), *args], check=True,
                       cwd=self.base, capture_output=True, timeout=120)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "server.log"),
                  "-w", "-t", "60", "start")

    def restart(self) -> None:
        """Fast restart: every open connection is cut, committed data stays."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "server.log"),
                  "-m", "fast", "-w", "-t", "60", "restart")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def connect(self, dbname: str = "postgres") -> Any:
        import psycopg
        return psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER,
                               password=self.password, dbname=dbname, autocommit=True)

    def database(self, workdir: Path) -> dict[str, Any]:
        """A new empty database; returns the service config's `store:` section (its password
        file written in `workdir`, mode 0600)."""
        name = f"t{os.getpid()}_{next(self._names)}"
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        workdir.mkdir(parents=True, exist_ok=True)
        pw = workdir / "pg.password"
        pw.write_text(self.password + "\n")
        pw.chmod(0o600)
        return {"backend": "postgresql", "host": "127.0.0.1", "port": self.port,
                "dbname": name, "user": SUPERUSER, "password_file": str(pw),
                "sslmode": "disable"}
