"""Sweeps: moving what customers deposited from the deposit addresses to the treasury,
with a deposit key that never comes online (docs/DEPOSITS.md, "Sweeps"; docs/KEYS.md)."""
