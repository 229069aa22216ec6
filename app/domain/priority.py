"""Job priority with aging: the rule the claim statement (app/store/claim_statements.py) orders by.

A due job's effective priority is its priority (0-9, higher first) plus one level for every
`aging_s` seconds (CRONHOOK_PRIORITY_AGING_S) it has waited past its due time. So among jobs due together the higher
priority goes first, but a priority-0 job that has waited 9 x `aging_s` outranks a fresh
priority-9 job: a flood of high-priority work delays low-priority work, never starves it.
"""

from __future__ import annotations

# Backed by the jobs CHECK (app/store/tables.py) and the API's bounds.
MIN_PRIORITY = 0
MAX_PRIORITY = 9
