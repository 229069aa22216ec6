"""CRONHOOK_DATABASE_URL in libpq's forms (several hosts, sockets, passwords nobody quoted),
the secret settings read from files (`*_FILE`), and the rule that an external database needs
the deployment's one key ring: what an operator types, answered in one line."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.db.url import DatabaseUrlError, parse_database_url
from app.keyring import KeyRingError, new_key_entry
from app.settings import FILE_SETTINGS, Settings, read_secret_files

# Every printable ASCII character a password can hold, URL-special ones included.
HOSTILE_PASSWORD = "p@ss/w#rd?:%41&=;[]" + string.punctuation


def test_one_host_and_its_parts() -> None:
    url = parse_database_url("postgres://app:secret@db.internal:6432/cronhook?sslmode=require")
    assert (url.drivername, url.username, url.password, url.host, url.port, url.database) == (
        "postgresql+asyncpg",
        "app",
        "secret",
        "db.internal",
        6432,
        "cronhook",
    )
    # asyncpg's names for libpq's parameters.
    assert dict(url.query) == {"ssl": "require"}
    assert dict(parse_database_url("postgresql://a@h/db?connect_timeout=5").query) == {"timeout": "5"}


def test_several_hosts_follow_the_primary_by_default() -> None:
    url = parse_database_url("postgresql://app@pg-a:5432,pg-b:5433,10.0.0.3/cronhook")
    assert url.query["host"] == ("pg-a:5432", "pg-b:5433", "10.0.0.3:5432")
    assert url.query["target_session_attrs"] == "read-write"
    assert url.host is None and url.database == "cronhook"


def test_an_explicit_target_session_attrs_is_kept() -> None:
    url = parse_database_url("postgresql://app@a,b/db?target_session_attrs=primary")
    assert url.query["target_session_attrs"] == "primary"
    assert url.query["host"] == ("a:5432", "b:5432")


def test_a_socket_directory_as_the_embedded_server_writes_it() -> None:
    url = parse_database_url("postgresql+asyncpg://postgres:@/postgres?host=/tmp/cht1/pg")
    assert url.query["host"] == "/tmp/cht1/pg"
    assert url.host is None and url.username == "postgres"


def test_a_rendered_url_reads_back_the_same() -> None:
    url = parse_database_url("postgresql://app:pw@a:1,b:2/db")
    again = parse_database_url(url.render_as_string(hide_password=False))
    assert again == url


@pytest.mark.parametrize("password", [HOSTILE_PASSWORD, "a@b", "x/y", "h#sh", "q?uery", "c:olon", "50%off", "sp ace"])
def test_a_password_pasted_unquoted_is_read_whole(password: str) -> None:
    url = parse_database_url(f"postgresql://cronhook:{password}@postgres:5432/cronhook")
    # libpq decodes percent-escapes; a % not followed by two hex digits stays as it is.
    expected = password.replace("%41", "A")
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "cronhook",
        expected,
        "postgres",
        5432,
        "cronhook",
    )


def test_the_separate_password_wins_and_needs_no_quoting() -> None:
    url = parse_database_url("postgresql://cronhook:old@postgres/cronhook", password=HOSTILE_PASSWORD)
    assert url.password == HOSTILE_PASSWORD


MALFORMED = [
    ("", "must start with postgresql://"),
    ("localhost:5432", "must start with postgresql://"),
    ("mysql://u@h/db", "unsupported scheme"),
    ("postgresql://u@h:5432,h2:abc/db", "port 'abc'"),
    ("postgresql://u@h:99999/db", "port '99999'"),
    ("postgresql://u@h:/db", "empty port"),
    ("postgresql://u@h,,h2/db", "empty host"),
    ("postgresql://u@::1/db", "must be in brackets"),
    ("postgresql://u@h sp/db", "no host list follows the user part"),
    ("postgresql://h sp/db", "not a host name"),
    ("postgresql://u@h/db?target_session_attrs=bogus", "target_session_attrs must be one of"),
    ("postgresql://u@h/db?flag", "name=value pairs"),
    ("postgresql://u@h/db?password=hunter2", "CRONHOOK_DATABASE_PASSWORD"),
    ("postgresql://u@h1/db?host=h2", "not both"),
    ("postgresql://u@h1:1,h2/db?port=5", "its own port"),
    ("postgresql://u@[::1]:1,h2/db", "IPv6 address cannot stand in a list"),
    ("postgresql://u@h/db?sslrootcert=/ca.pem", "set PGSSLROOTCERT instead"),
    ("postgresql://u@h/db?application_name=x", "cannot be set in the URL"),
    ("postgresql://u@h/db?frobnicate=1", "unsupported parameter 'frobnicate'"),
    ("postgresql://u@h/db?connect_timeout=soon", "connect_timeout must be a number"),
    ("postgresql://app:Hunter2secret@${DB_HOST}/db", "no host list follows the user part"),
]


@pytest.mark.parametrize(("raw", "says"), MALFORMED)
def test_a_malformed_url_is_one_clear_line(raw: str, says: str) -> None:
    with pytest.raises(DatabaseUrlError) as caught:
        parse_database_url(raw)
    message = str(caught.value)
    assert says in message
    assert "\n" not in message and "hunter2" not in message.lower()


def test_settings_name_the_setting_and_never_echo_the_password() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(database_url="postgresql://app:hunter2@db:notaport/x")
    (error,) = caught.value.errors()
    assert error["loc"] == ("database_url",)
    assert "port 'notaport'" in error["msg"]
    assert "hunter2" not in str(caught.value)


def test_settings_put_the_separate_password_into_the_url() -> None:
    settings = Settings(database_url="postgresql://app@db/cronhook", database_password=HOSTILE_PASSWORD)
    assert settings.database is not None and settings.database.password == HOSTILE_PASSWORD
    assert Settings(database_url=None).database is None


def test_every_secret_setting_reads_from_a_file(tmp_path: Path) -> None:
    values = {
        "database_url": "postgresql://app@db/cronhook",
        "database_password": HOSTILE_PASSWORD,
        "bootstrap_api_key": "b" * 32,
        "admin_api_key": "a" * 32,
        "secret_keys": new_key_entry("k1"),
    }
    assert set(values) == set(FILE_SETTINGS)
    environ = {}
    for name, value in values.items():
        path = tmp_path / name
        path.write_text(value + "\n")  # as `echo` or an editor leaves it
        environ[f"CRONHOOK_{name.upper()}_FILE"] = str(path)
    assert read_secret_files({}, environ) == values


def test_a_secret_given_twice_or_from_a_missing_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "keys"
    secret.write_text(new_key_entry("k1"))
    with pytest.raises(ValueError, match="set CRONHOOK_SECRET_KEYS or CRONHOOK_SECRET_KEYS_FILE, not both"):
        read_secret_files({"secret_keys": "x"}, {"CRONHOOK_SECRET_KEYS_FILE": str(secret)})
    with pytest.raises(ValueError, match="CRONHOOK_ADMIN_API_KEY_FILE: cannot read"):
        read_secret_files({}, {"CRONHOOK_ADMIN_API_KEY_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        read_secret_files({}, {"CRONHOOK_ADMIN_API_KEY_FILE": str(tmp_path / "empty")})


def test_settings_read_the_key_ring_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = new_key_entry("filekey")
    (tmp_path / "ring").write_text(entry + "\n")
    monkeypatch.delenv("CRONHOOK_SECRET_KEYS", raising=False)
    monkeypatch.setenv("CRONHOOK_SECRET_KEYS_FILE", str(tmp_path / "ring"))
    settings = Settings(database_url="postgresql://app@db/cronhook")
    assert settings.load_key_ring().primary_id == "filekey"


def test_an_external_database_without_a_key_ring_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRONHOOK_SECRET_KEYS", raising=False)
    settings = Settings(database_url="postgresql://app@db/cronhook", data_dir=tmp_path)
    with pytest.raises(KeyRingError, match=r"CRONHOOK_SECRET_KEYS .* is required with CRONHOOK_DATABASE_URL"):
        settings.load_key_ring()
    # No key file was generated for it: a key no other process holds is what went wrong before.
    assert not (tmp_path / "secret-keys").exists()
    # The embedded single-machine default still makes its own.
    assert Settings(data_dir=tmp_path).load_key_ring().key_ids
    assert (tmp_path / "secret-keys").exists()


def test_no_primary_in_the_host_list_is_an_outage_with_its_reason() -> None:
    from asyncpg.exceptions import TargetServerAttributeNotMatched  # type: ignore[import-untyped]
    from sqlalchemy.exc import InternalError

    from app.db.errors import is_transient_db_error, outage_reason

    driver_error = Exception("wrapped")
    driver_error.__cause__ = TargetServerAttributeNotMatched("none of the hosts match")
    wrapped = InternalError("connect", None, driver_error)
    assert is_transient_db_error(wrapped)
    assert "is a primary" in outage_reason(wrapped)
    assert not is_transient_db_error(InternalError("x", None, Exception("a bug")))
