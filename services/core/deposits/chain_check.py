"""Is the node configured for a chain that chain? Checked before anything is written or
paid there, and again until it passes.

Two facts, each a chain incident when it fails (`incidents.WRONG_CHAIN`,
`incidents.TOKEN_DECIMALS`):

- the node's chain id is the chain's: a watcher pointed at another chain's node would
  record that chain's transfers as deposits here, and a payer would judge payments by
  another chain's nonces and receipts;
- each token's `decimals()` on chain is the chains file's: amounts are read and paid in
  base units through those decimals, so a wrong figure pays 10^12 times too much or
  too little.

Until the check passes nothing is read (the watcher writes no cursor) and nothing is
paid (the payer's deposits wait, `payments_paused`). It is asked again every round, so
a fixed URL or chains file (the process restarted) resumes by itself, and Settle then
resolves the incident it raised. One check per chain and process, shared by that
chain's watcher and payer; it passes once and stays passed for the process's life.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from services.core.chains import Chain
from services.core.deposits import incidents
from services.core.evm import ChainIdMismatch
from shared.db import Database
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class NodeFacts(Protocol):
    """What the check asks a node (a `Web3ChainReader`)."""

    @property
    def chain_id(self) -> int:
        """The node's chain id; ChainIdMismatch when it is not the configured one."""
        ...

    def token_decimals(self, token: str) -> int | None:
        """A token's `decimals()` (None: no answer there)."""
        ...


class ChainCheck:
    """One chain's node against the chains file (see the module docstring).

    `tokens`: check each token's decimals too. `strict`: the node must serve the chains
    file's chain id; otherwise the one its reader was built for (the reader refuses
    another: ChainIdMismatch). The worker's checks are both; a watcher built without a
    check (tools, tests watching a test chain under a chain id of their own) checks
    its reader's chain id alone.
    """

    def __init__(
        self,
        db: Database,
        chain: Chain,
        node: NodeFacts,
        *,
        tokens: bool = True,
        strict: bool = True,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.chain = chain
        self.node = node
        self.tokens = tokens
        self.strict = strict
        self.clock = clock
        self._passed = False
        self._lock = threading.Lock()
        #: Why the chain is stopped, as last found (None: passed, or not asked yet).
        self.problem: str | None = None

    @property
    def chain_id(self) -> int:
        return self.chain.chain_id

    def ready(self) -> bool:
        """True once the node has passed; otherwise ask it (again) now."""
        if self._passed:
            return True
        with self._lock:
            if self._passed:
                return True
            return self._ask()

    def _ask(self) -> bool:
        chain = self.chain
        try:
            served = self.node.chain_id
            wrong = self.strict and served != chain.chain_id
        except ChainIdMismatch as exc:
            served, wrong = exc.actual, True
        except Exception as exc:  # unreachable or failing: not known yet, try next round
            self.problem = f"the node could not be asked ({type(exc).__name__}: {exc})"
            log.warning("chain %s: %s", chain.chain_id, self.problem)
            return False
        if wrong:
            self._stop(
                incidents.WRONG_CHAIN,
                f"the node configured for chain {chain.chain_id} ({chain.name}) serves chain "
                f"{served}: nothing is read or paid on chain {chain.chain_id} until it serves "
                f"it (fix SETTLE_RPC_URL_{chain.chain_id})",
                {"expected": chain.chain_id, "served": served},
            )
            return False
        if self.tokens:
            wrong = []
            for asset in chain.assets:
                try:
                    on_chain = self.node.token_decimals(asset.token_address)
                except Exception as exc:  # not known yet
                    self.problem = f"decimals() of {asset.symbol} not answered ({exc})"
                    log.warning("chain %s: %s", chain.chain_id, self.problem)
                    return False
                if on_chain != asset.decimals:
                    wrong.append((asset, on_chain))
            if wrong:
                asset, on_chain = wrong[0]
                listed = "; ".join(
                    f"{a.symbol} {a.token_address}: {d} decimals on chain, {a.decimals} in the "
                    "chains file"
                    for a, d in wrong
                )
                self._stop(
                    incidents.TOKEN_DECIMALS,
                    f"chain {chain.chain_id} ({chain.name}): {listed}; nothing is read or paid "
                    "on this chain until the chains file and the chain agree",
                    {
                        "token": asset.token_address,
                        "onChain": on_chain,
                        "chainsFile": asset.decimals,
                    },
                )
                return False
        self._passed = True
        self.problem = None
        kinds = incidents.SELF_CLEARING if self.tokens else (incidents.WRONG_CHAIN,)
        with self.db.transaction() as session:
            cleared = incidents.clear(
                session,
                chain.chain_id,
                kinds,
                f"the node serves chain {chain.chain_id}"
                + (" and every token's decimals match the chains file" if self.tokens else ""),
                self.clock(),
            )
        if cleared:
            log.warning(
                "chain %s: the node checks out again; %s incident(s) resolved",
                chain.chain_id,
                cleared,
            )
        return True

    def _stop(self, kind: str, detail: str, facts: dict[str, object]) -> None:
        self.problem = detail
        log.error("chain %s: %s", self.chain.chain_id, detail)
        with self.db.transaction() as session:
            incidents.raise_once(
                session, self.chain.chain_id, kind, detail, self.clock(), facts=facts
            )
