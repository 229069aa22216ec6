"""One key ring per bench run for secrets at rest (app/keyring.py): installed in the bench's
own process (targets made through the store are sealed with it) and handed to every cronhook
process it starts (CRONHOOK_SECRET_KEYS), so they open what the bench stored."""

from __future__ import annotations

from app.keyring import install_key_ring, new_key_entry, parse_key_ring

BENCH_SECRET_KEYS = new_key_entry("bench")
install_key_ring(parse_key_ring(BENCH_SECRET_KEYS))
