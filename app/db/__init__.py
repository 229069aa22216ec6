"""Database plumbing: engines, the embedded server and migrations."""
