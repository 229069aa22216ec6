"""The schema revision the release checks without Alembic (app/db/schema_head.py) is the newest
migration's: a new migration that forgets to bump it fails here, not as a readiness probe
that says a migrated database is behind."""

from app.db.migrate import head_revision
from app.db.schema_head import SCHEMA_HEAD


def test_the_schema_head_is_alembics() -> None:
    assert head_revision() == SCHEMA_HEAD
