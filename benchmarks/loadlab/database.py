"""The metadata database of a load test: a throwaway Postgres cluster under the work directory when this
machine has one (``initdb``/``pg_ctl`` and the ``psycopg2`` driver), else sqlite.

sqlite's limits, stated in the output: one writer at a time (the scheduler, the triggerer, the api-server and
every task's supervisor queue on one file lock), no row locks (``SELECT ... FOR UPDATE`` is a no-op, so one
scheduler only), and Airflow warns against it outside tests. The figures of a sqlite run are an upper bound
of the scheduling overhead a Postgres deployment would see.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.airflow_server import free_port

SQLITE_LIMITS = (
    "sqlite: one writer at a time (every component waits on one file lock), no row locks (one scheduler "
    "only); Airflow supports it for tests only, so these figures bound a Postgres deployment's from above"
)


def _postgres_missing() -> str | None:
    """Why Postgres cannot be used here (None: it can)."""
    if not (shutil.which("initdb") and shutil.which("pg_ctl")):
        return "no initdb/pg_ctl on PATH"
    import importlib.util

    # Airflow 3 opens the database with both: psycopg2 (sync) and asyncpg (its async engine)
    missing = [m for m in ("psycopg2", "asyncpg") if importlib.util.find_spec(m) is None]
    if missing:
        return f"no {' or '.join(missing)} (pip install psycopg2-binary asyncpg, or put them on PYTHONPATH)"
    return None


def driver_paths() -> list[str]:
    """Where this interpreter found the Postgres drivers: Airflow's processes get them on PYTHONPATH (a
    caller such as faults.py may have replaced the PYTHONPATH that brought them here)."""
    import importlib.util

    paths = []
    for module in ("psycopg2", "asyncpg"):
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin:
            paths.append(str(Path(spec.origin).parents[1]))
    return sorted(set(paths))


class Database:
    """``url`` for ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``; ``kind`` is "postgres" or "sqlite"."""

    def __init__(self, work: Path, want: str = "auto") -> None:
        self.work = work
        self.kind, self.url, self.note = "sqlite", f"sqlite:///{work / 'airflow.db'}", SQLITE_LIMITS
        self.data_dir: Path | None = None
        self._as: list[str] = []
        self._start: list[str] = []
        self.pythonpath: list[str] = []
        missing = _postgres_missing() if want != "sqlite" else "sqlite asked for"
        if missing is None:
            try:
                self._start_postgres()
                return
            except (OSError, subprocess.SubprocessError) as err:
                missing = f"Postgres did not start: {err}"
        if want == "postgres":
            raise RuntimeError(f"--db postgres: {missing}")
        self.note = f"{SQLITE_LIMITS} [{missing}]"

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as, *argv], check=True, capture_output=True, timeout=120)

    def _start_postgres(self) -> None:
        """initdb and pg_ctl start, as the ``postgres`` user when run as root (Postgres refuses root)."""
        base = Path(tempfile.mkdtemp(prefix="dtrain-pg-", dir="/tmp"))
        self.data_dir, port = base / "data", free_port()
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(base, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data_dir), "-A", "trust", "-U", "airflow", "--no-sync")
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
        self._start = [
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-o",
            options,
            "-l",
            str(base / "pg.log"),
            "-w",
            "start",
        ]
        self._run(*self._start)
        self.kind, self.note = "postgres", f"Postgres (throwaway cluster, {self.data_dir})"
        self.pythonpath = driver_paths()
        self.url = f"postgresql+psycopg2://airflow@127.0.0.1:{port}/postgres"

    def stop_for(self, seconds: float) -> None:
        """The database unavailable for ``seconds``: Postgres stopped and started again; sqlite's file held
        under an exclusive lock (every writer and reader waits, then times out: "database is locked")."""
        import time

        if self.kind == "postgres":
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "stop")
            time.sleep(seconds)
            self._run(*self._start)
            return
        import sqlite3

        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=60)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
        finally:
            conn.rollback()
            conn.close()

    def stop(self) -> None:
        if self.kind == "postgres" and self.data_dir is not None:
            try:
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "stop")
            except (OSError, subprocess.SubprocessError):
                pass
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)
