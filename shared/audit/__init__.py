"""The audit log: every change a tenant cares about, append-only and hash-chained."""
