"""Sweeps: moving what customers deposited from the deposit addresses to the treasury,
with keys that never come online (docs/SWEEPS.md... see docs/DEPOSITS.md, "Sweeps")."""
