"""The watcher: cloud events and agent reports -> SQLite ledger -> policy -> re-apply.

Modules: ``events`` (what can happen), ``sources/`` (one poller per cloud), ``server`` (the agents'
HTTP endpoint), ``ledger`` (durable record, exactly-once acting), ``acting`` (apply/bootstrap with
backoff), ``watcher`` (the loop), ``status`` (the ledger's view and cost).
"""
