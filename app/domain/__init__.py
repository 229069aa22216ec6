"""Pure domain logic: job states, schedule and retry math, signing. No I/O here."""
