"""All SQL lives here: SQLAlchemy Core statements in functions named entity_verb."""
