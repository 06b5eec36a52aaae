"""Settlement routes behind one interface, inventory balances and route provider health.

Three kinds of route carry a credit to the deposit's destination:

- `direct`: the deposit's own chain and token. Settle's payer on that chain pays at once.
- `inventory`: another chain or token; Settle pays at once from its own tracked balance
  on the destination chain (no `credit_submitted`).
- `routed`: a route provider bridges the value; the credit is in flight
  (`credit_submitted`) until the provider reports it done or failed.

Every route answers `start(order)` and `poll(order, ref)` with an `Outcome`: `Credited`
(with the credit's transaction), `InFlight` (with a reference to poll) or `Failed`.
Payers and providers are called outside any database transaction; the service records
their answers. Sandbox deposits only ever use the simulated payer and provider.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa
from eth_utils import keccak
from sqlalchemy.orm import Session

from services.core import outbox
from services.core.chains import Chain, ChainRegistry
from services.core.deposits import gas_pricing
from services.core.deposits.models import (
    Deposit,
    HotWalletShortfall,
    InventoryBalance,
    RouteProviderHealth,
)
from services.core.deposits.outcomes import (
    Credited,
    CreditOrder,
    Failed,
    InFlight,
    Outcome,
    PayerWaits,
    Shortfall,
    Waiting,
)
from services.core.deposits.payments import Draft, Mined, Observation, PaymentView
from services.core.deposits.settings import InventorySeed
from services.core.deposits.states import WAIT_FEE_CAP, WAIT_HOT_WALLET_SHORT, WAIT_PAYMENTS_PAUSED
from services.core.models import DepositAccount
from shared import events
from shared.db import Database
from shared.timefmt import iso_ms, utcnow

if TYPE_CHECKING:
    # Not at run time: hot_wallet imports web3, which the API processes must not load
    # (its py_ecc raises the recursion limit to 100000); only the paying worker needs it.
    from services.core.hot_wallet import Erc20TransferExecutor, Market, Signed

log = logging.getLogger(__name__)

DIRECT = "direct"
INVENTORY = "inventory"
ROUTED = "routed"
#: Credited by ops with a transaction they made themselves.
MANUAL = "manual"

HEALTHY = "healthy"
DEGRADED = "degraded"

Clock = Callable[[], datetime]


# --- routes: what answers a `CreditOrder` with an `Outcome` (deposits/outcomes.py) ------


class Route(Protocol):
    kind: str
    name: str
    #: `start` may safely run again for the same order (after a crash mid-call).
    idempotent: bool
    #: Answers at once without I/O (simulated): may run inside the deciding transaction.
    instant: bool

    def start(self, order: CreditOrder) -> Outcome: ...

    def poll(self, order: CreditOrder, ref: str) -> Outcome: ...


class Payer(Protocol):
    """Pays from Settle's own funds on one chain."""

    name: str
    idempotent: bool
    instant: bool

    def pay(self, order: CreditOrder) -> Outcome: ...

    def check(self, order: CreditOrder, ref: str) -> Outcome: ...


class RouteProvider(Protocol):
    """A third party that bridges value to the destination."""

    name: str
    idempotent: bool
    instant: bool

    def supports(self, order: CreditOrder) -> bool: ...

    def submit(self, order: CreditOrder) -> Outcome: ...

    def check(self, order: CreditOrder, ref: str) -> Outcome: ...

    def health(self) -> str | None:
        """None when healthy, else why not."""
        ...


@dataclass(frozen=True)
class PayerRoute:
    """A direct or inventory route: a payer on the destination chain.

    A hot wallet (`EvmPayer`) is driven step by step by the settling use case
    (`chain_payer`), not through `start`/`poll`.
    """

    kind: str
    payer: Payer | EvmPayer

    @property
    def chain_payer(self) -> EvmPayer | None:
        return self.payer if isinstance(self.payer, EvmPayer) else None

    @property
    def name(self) -> str:
        return self.payer.name

    @property
    def idempotent(self) -> bool:
        return self.payer.idempotent

    @property
    def instant(self) -> bool:
        return self.payer.instant

    def start(self, order: CreditOrder) -> Outcome:
        if isinstance(self.payer, EvmPayer):
            raise TypeError("a hot wallet is paid through deposits/payments.py")
        return self.payer.pay(order)

    def poll(self, order: CreditOrder, ref: str) -> Outcome:
        if isinstance(self.payer, EvmPayer):
            raise TypeError("a hot wallet is polled through deposits/payments.py")
        return self.payer.check(order, ref)


@dataclass(frozen=True)
class ProviderRoute:
    """A routed credit through a route provider."""

    provider: RouteProvider
    kind: str = ROUTED

    @property
    def name(self) -> str:
        return self.provider.name

    @property
    def idempotent(self) -> bool:
        return self.provider.idempotent

    @property
    def instant(self) -> bool:
        return self.provider.instant

    def start(self, order: CreditOrder) -> Outcome:
        return self.provider.submit(order)

    def poll(self, order: CreditOrder, ref: str) -> Outcome:
        return self.provider.check(order, ref)


# --- payers and providers -------------------------------------------------------------


def simulated_tx_hash(label: str, deposit_id: str) -> str:
    """A deterministic fake transaction hash (the same for the same deposit)."""
    return "0x" + keccak(text=f"settle:{label}:{deposit_id}").hex()


class SimulatedPayer:
    """Pays at once without touching a chain (dev, demos, sandbox)."""

    idempotent = True
    instant = True

    def __init__(self, name: str = "simulated-payer") -> None:
        self.name = name

    def pay(self, order: CreditOrder) -> Outcome:
        return Credited(simulated_tx_hash(self.name, order.deposit_id))

    def check(self, order: CreditOrder, ref: str) -> Outcome:
        return Credited(simulated_tx_hash(self.name, order.deposit_id))


class SimulatedBridge:
    """A route provider that bridges after `delay_s` (dev, demos, sandbox).

    Stateless: the reference carries the submission time, so it survives restarts and
    answers the same in every worker process.
    """

    idempotent = True
    instant = True

    def __init__(self, name: str = "simulated-bridge", delay_s: float = 1.0, clock: Clock = utcnow):
        self.name = name
        self.delay_s = delay_s
        self.clock = clock

    def supports(self, order: CreditOrder) -> bool:
        return True

    def submit(self, order: CreditOrder) -> Outcome:
        return InFlight(f"{order.deposit_id}@{int(self.clock().timestamp() * 1000)}")

    def check(self, order: CreditOrder, ref: str) -> Outcome:
        _, _, submitted_ms = ref.rpartition("@")
        try:
            submitted = int(submitted_ms) / 1000
        except ValueError:
            return Failed(f"unknown reference {ref}")
        if self.clock().timestamp() - submitted >= self.delay_s:
            return Credited(simulated_tx_hash(self.name, order.deposit_id))
        return InFlight(ref)

    def health(self) -> str | None:
        return None


class Readiness(Protocol):
    """Whether a chain's node is the chain the chains file describes (`ChainCheck`)."""

    problem: str | None

    def ready(self) -> bool: ...


#: The token address a shortfall of gas names (the chain's native token).
NATIVE_TOKEN = "0x0000000000000000000000000000000000000000"
NATIVE_DECIMALS = 18


class EvmPayer:
    """Pays with an ERC-20 `transfer` from the hot wallet on the destination chain.

    Idempotent by nonce (`deposits/payments.py`): the settling steps draft, sign, store
    and only then broadcast; afterwards they observe the payment and broadcast the same
    bytes again, a replacement with the same nonce, or its cancel, never a new payment.
    So a step that never came back (a crash) may safely run again.

    `check`: the chain's node against the chains file (shared with its watcher); until
    it passes, drafting waits (`payments_paused`) and observing fails (unknown).
    """

    idempotent = True
    instant = False

    def __init__(
        self,
        executor: Erc20TransferExecutor,
        *,
        check: Readiness | None = None,
        name: str = "hot-wallet",
    ) -> None:
        self.executor = executor
        self.check = check
        self.name = name

    @property
    def wallet(self) -> str:
        return self.executor.address

    def _verify(self) -> None:
        """The node is the chain's, or ChainIdMismatch / PayerWaits."""
        if self.check is not None and not self.check.ready():
            raise PayerWaits(
                Waiting(
                    WAIT_PAYMENTS_PAUSED,
                    self.check.problem or "the chain's node is not checked yet",
                )
            )
        self.executor.verify_chain()

    def draft(self, order: CreditOrder, cap: int | None = None) -> Draft:
        """The unsigned transfer, the pending nonce, the head; PayerWaits (nothing signed)
        when the wallet is short of the token or of gas, or the market is over `cap` (wei
        per gas)."""
        from services.core.evm import ChainIdMismatch

        executor = self.executor
        try:
            self._verify()
        except ChainIdMismatch as exc:
            raise PayerWaits(Waiting(WAIT_PAYMENTS_PAUSED, str(exc))) from exc
        token = order.dest_token_address
        balance = executor.token_balance(token)
        if balance < order.amount_raw:
            raise PayerWaits(
                self._short(
                    order, token, order.dest_asset, order.dest_decimals, balance, order.amount_raw
                )
            )
        market = executor.market()
        fees = gas_pricing.within_cap(market.fees, market.base_fee, cap)
        if fees is None:
            raise PayerWaits(
                Waiting(
                    WAIT_FEE_CAP,
                    f"the market asks {gas_pricing.offered(market.fees)} wei per gas on chain "
                    f"{order.dest_chain_id}, over its cap of {cap} (SETTLE_PAYMENT_MAX_FEE_GWEI)",
                )
            )
        tx = executor.draft(token, order.dest_address, order.amount_raw, order.tag, fees=fees)
        gas_cost = int(tx["gas"]) * gas_pricing.offered(tx)
        native = executor.native_balance()
        if native < gas_cost:
            raise PayerWaits(
                self._short(order, NATIVE_TOKEN, "native", NATIVE_DECIMALS, native, gas_cost)
            )
        return Draft(tx, executor.nonce("pending"), executor.head())

    def _short(
        self, order: CreditOrder, token: str, asset: str, decimals: int, balance: int, needed: int
    ) -> Waiting:
        shortfall = Shortfall(
            order.dest_chain_id,
            token,
            asset,
            self.wallet,
            Decimal(balance).scaleb(-decimals),
            Decimal(needed).scaleb(-decimals),
        )
        what = "gas" if token == NATIVE_TOKEN else asset
        return Waiting(
            WAIT_HOT_WALLET_SHORT,
            f"the hot wallet {self.wallet} holds {shortfall.balance} {what} on chain "
            f"{order.dest_chain_id}; the payout needs {shortfall.needed}",
            shortfall,
        )

    def sign(self, tx: dict[str, Any], nonce: int) -> Signed:
        return self.executor.sign(tx, nonce)

    def market(self) -> Market:
        return self.executor.market()

    def sign_cancel(self, tx: dict[str, Any], nonce: int) -> Signed:
        """A zero-value transfer to the wallet itself with `nonce`, priced to replace `tx`."""
        fees = gas_pricing.cancel_fees(tx, self.executor.market())
        return self.executor.sign(self.executor.cancel_tx(fees), nonce)

    def broadcast(self, raw: str) -> None:
        """Broadcast signed bytes; an error is logged, never raised: the payment is stored
        and its poll finds out what happened (and broadcasts again if the node lost it)."""
        try:
            self.executor.broadcast(raw)
        except Exception as exc:  # a timeout may hide a node that took it: unknown
            log.warning(
                "broadcast by %s: %s: %s (the poll will find out)",
                self.name,
                type(exc).__name__,
                exc,
            )

    def observe(self, payment: PaymentView, chain: Chain) -> Observation:
        """What the chain says about a payment (every transaction of its nonce), judged
        at the chain's finality (`Chain.final_height`)."""
        self._verify()
        executor = self.executor
        head = executor.head()
        tag = chain.finality_tag
        final_at = chain.final_height(head, executor.tagged_block(tag) if tag else None)
        # The nonce first, receipts after: a transaction mined in between shows up in
        # its receipt.
        settled_nonce = executor.nonce(max(0, final_at))
        candidates = payment.candidates
        mined = None
        stale = False
        for tx_hash in candidates:
            receipt = executor.receipt(tx_hash)
            if receipt is None:
                continue
            # A node on a stale fork may still serve a receipt from a block the chain
            # dropped: only a receipt whose block is canonical counts.
            if executor.block_hash(receipt.block_number) != receipt.block_hash:
                log.warning("receipt of %s is from a non-canonical block", tx_hash)
                stale = True
                continue
            final = receipt.block_number <= final_at
            moved = None
            if final and receipt.status == 1 and tx_hash != payment.cancel_tx_hash:
                # Paid is the token's Transfer log to the destination, asked by the block's
                # hash: a status 1 alone is not (a token may answer `false`, or move less).
                token, to, _ = payment.transfer()
                moved = executor.transferred(receipt.block_hash, tx_hash, token, to)
            mined = Mined(tx_hash, receipt.status, receipt.block_number, final, moved)
            break
        nonce_used = False
        if mined is None and settled_nonce > payment.nonce and not stale:
            # Proof, not inference: the canonical transaction that used the nonce, searched
            # from where the payment's first transaction was signed (a replacement's block
            # may be past it).
            user = executor.nonce_user(payment.nonce, final_at, payment.first_signed_block)
            if user is not None and user not in candidates:
                nonce_used = True
            elif user is not None:
                log.warning("payment %s is mined but its receipt is not served yet", user)
            else:
                log.warning(
                    "nonce %s of %s passed on chain %s, but no transaction with it was found",
                    payment.nonce,
                    self.wallet,
                    chain.chain_id,
                )
        known = mined is not None or executor.known(candidates[-1])
        return Observation(head, mined, nonce_used, known)


# --- choosing routes, inventory, provider health --------------------------------------


def _dec(text: str) -> Decimal:
    return Decimal(text)


def _units(amount: Decimal) -> str:
    """Token units as the shortest decimal text (`10`, `10.5`)."""
    return f"{amount.normalize():f}"


class Settlement:
    """Picks a route for a credit, keeps inventory balances and provider health."""

    def __init__(
        self,
        registry: ChainRegistry,
        *,
        payers: Mapping[int, Payer | EvmPayer] | None = None,
        providers: Sequence[RouteProvider] = (),
        sandbox_payer: Payer | None = None,
        sandbox_provider: RouteProvider | None = None,
        provider_max_failures: int = 3,
    ) -> None:
        self.registry = registry
        self.payers = dict(payers or {})
        self.providers = list(providers)
        self.sandbox_payer = sandbox_payer or SimulatedPayer("sandbox-payer")
        self.sandbox_provider = sandbox_provider or SimulatedBridge("sandbox-bridge", 0.0)
        self.provider_max_failures = provider_max_failures

    # -- routes ------------------------------------------------------------------------

    def route_for(self, deposit: Deposit) -> Route | None:
        """The route a deposit was given (to poll it or recover it), if still configured."""
        if deposit.route in (DIRECT, INVENTORY):
            payer = (
                self.sandbox_payer if deposit.sandbox else self.payers.get(deposit.dest_chain_id)
            )
            if payer is not None and payer.name == deposit.provider:
                return PayerRoute(deposit.route, payer)
            return None
        if deposit.route == ROUTED:
            candidates = [self.sandbox_provider] if deposit.sandbox else self.providers
            for provider in candidates:
                if provider.name == deposit.provider:
                    return ProviderRoute(provider)
        return None

    def choose(
        self, session: Session, deposit: Deposit, order: CreditOrder, now: datetime
    ) -> Route | None:
        """The best available route; takes the amount from inventory when it pays from it.

        Direct first, then inventory, then healthy route providers (those that have not
        yet failed this deposit before those that have).
        """
        if order.sandbox:
            if order.same_token:
                return PayerRoute(DIRECT, self.sandbox_payer)
            return ProviderRoute(self.sandbox_provider)
        payer = self.payers.get(order.dest_chain_id)
        if payer is not None:
            inventory = session.get(
                InventoryBalance,
                (order.dest_chain_id, order.dest_token_address),
                with_for_update=True,
            )
            if order.same_token and inventory is None:
                return PayerRoute(DIRECT, payer)
            if inventory is not None and _dec(inventory.balance) >= order.amount:
                self._take(session, inventory, order.amount, now)
                deposit.inventory_reserved = str(order.amount)
                return PayerRoute(DIRECT if order.same_token else INVENTORY, payer)
        degraded = set(
            session.scalars(
                sa.select(RouteProviderHealth.name).where(RouteProviderHealth.status == DEGRADED)
            )
        )
        tried = set(deposit.failed_providers or [])
        usable = [p for p in self.providers if p.name not in degraded and p.supports(order)]
        usable.sort(key=lambda p: p.name in tried)  # stable: untried ones first
        return ProviderRoute(usable[0]) if usable else None

    def release(self, session: Session, deposit: Deposit, now: datetime) -> None:
        """Give back what the deposit took from inventory (its payment did not happen)."""
        if deposit.inventory_reserved is None:
            return
        inventory = session.get(
            InventoryBalance,
            (deposit.dest_chain_id, deposit.dest_token_address),
            with_for_update=True,
        )
        if inventory is not None:
            inventory.balance = str(_dec(inventory.balance) + _dec(deposit.inventory_reserved))
            inventory.updated_at = now
            if _dec(inventory.balance) >= _dec(inventory.low_threshold):
                inventory.low_alerted = False
        deposit.inventory_reserved = None

    def _take(
        self, session: Session, inventory: InventoryBalance, amount: Decimal, now: datetime
    ) -> None:
        inventory.balance = str(_dec(inventory.balance) - amount)
        inventory.updated_at = now
        if _dec(inventory.balance) < _dec(inventory.low_threshold) and not inventory.low_alerted:
            inventory.low_alerted = True
            session.flush()
            self._emit_low_balance(session, inventory, now)

    def _emit_low_balance(
        self, session: Session, inventory: InventoryBalance, now: datetime
    ) -> None:
        """`inventory.low_balance` to each tenant whose accounts settle in this token."""
        self._notify_low(
            session, inventory.chain_id, inventory.token_address, inventory_document(inventory), now
        )
        log.warning(
            "inventory of %s on chain %s is low: %s (threshold %s)",
            inventory.asset,
            inventory.chain_id,
            inventory.balance,
            inventory.low_threshold,
        )

    @staticmethod
    def _notify_low(
        session: Session,
        chain_id: int,
        token_address: str,
        document: dict[str, object],
        now: datetime,
    ) -> None:
        """`inventory.low_balance` to each tenant whose accounts settle in this token on
        this chain (every token of the chain for its gas: NATIVE_TOKEN)."""
        stmt = sa.select(DepositAccount.tenant_id).where(DepositAccount.dest_chain_id == chain_id)
        if token_address != NATIVE_TOKEN:
            stmt = stmt.where(DepositAccount.dest_token_address == token_address)
        for tenant_id in session.scalars(stmt.distinct()):
            outbox.emit(
                session,
                events.INVENTORY_LOW_BALANCE,
                tenant_id,
                {"inventory": document},
                created_at=now,
            )

    # -- the hot wallet's own balances ---------------------------------------------------

    def hot_wallet_short(self, session: Session, shortfall: Shortfall, now: datetime) -> None:
        """The hot wallet held too little for a payout: the first time in a dip, keep it
        and tell the tenants settling there (`inventory.low_balance`), once."""
        key = (shortfall.chain_id, shortfall.token_address)
        row = session.get(HotWalletShortfall, key, with_for_update=True)
        if row is not None:
            row.balance, row.needed = _units(shortfall.balance), _units(shortfall.needed)
            return
        chain = self.registry.get(shortfall.chain_id)
        asset = shortfall.asset
        if shortfall.token_address == NATIVE_TOKEN and chain is not None:
            asset = chain.native_symbol
        row = HotWalletShortfall(
            chain_id=shortfall.chain_id,
            token_address=shortfall.token_address,
            asset=asset,
            wallet=shortfall.wallet,
            balance=_units(shortfall.balance),
            needed=_units(shortfall.needed),
            since=now,
        )
        try:
            with session.begin_nested():
                session.add(row)
        except sa.exc.IntegrityError:
            return  # another worker found the dip first, and told the tenants
        document = {
            "chainId": shortfall.chain_id,
            "asset": asset,
            "tokenAddress": shortfall.token_address,
            "balance": row.balance,
            "lowThreshold": row.needed,
            "updatedAt": iso_ms(now),
        }
        self._notify_low(session, shortfall.chain_id, shortfall.token_address, document, now)
        log.error(
            "ALERT hot wallet %s on chain %s holds %s %s, a payout needs %s: payouts there wait "
            "until it is topped up",
            shortfall.wallet,
            shortfall.chain_id,
            row.balance,
            asset,
            row.needed,
        )

    @staticmethod
    def hot_wallet_sufficient(session: Session, chain_id: int, token_address: str) -> None:
        """A payout found the token and the gas it needed: a dip under them is over."""
        session.execute(
            sa.delete(HotWalletShortfall).where(
                HotWalletShortfall.chain_id == chain_id,
                HotWalletShortfall.token_address.in_((token_address, NATIVE_TOKEN)),
            )
        )

    # -- provider health ---------------------------------------------------------------

    def provider_failed(self, session: Session, name: str, reason: str, now: datetime) -> None:
        """Count a failure (a route or a health check); degrade past the limit."""
        row = self._health_row(session, name, now)
        row.consecutive_failures += 1
        row.checked_at = now
        if row.status == HEALTHY and row.consecutive_failures >= self.provider_max_failures:
            row.status = DEGRADED
            row.reason = reason[:500]
            row.changed_at = now
            session.flush()
            self._emit_degraded(session, row, now)

    def provider_succeeded(self, session: Session, name: str, now: datetime) -> None:
        row = self._health_row(session, name, now)
        row.consecutive_failures = 0
        row.checked_at = now
        if row.status == DEGRADED:
            log.info("route provider %s is healthy again", name)
            row.status = HEALTHY
            row.reason = None
            row.changed_at = now

    def check_health(self, db: Database, now: datetime) -> int:
        """Ask every provider for its health; returns how many are degraded."""
        results = {}
        for provider in self.providers:
            try:
                results[provider.name] = provider.health()
            except Exception as exc:  # an unreachable provider is an unhealthy one
                results[provider.name] = f"{type(exc).__name__}: {exc}"
        degraded = 0
        with db.transaction() as session:
            for name, problem in results.items():
                if problem is None:
                    self.provider_succeeded(session, name, now)
                else:
                    self.provider_failed(session, name, f"health check failed: {problem}", now)
                row = session.get(RouteProviderHealth, name)
                degraded += bool(row is not None and row.status == DEGRADED)
        return degraded

    def _health_row(self, session: Session, name: str, now: datetime) -> RouteProviderHealth:
        stmt = (
            sa.select(RouteProviderHealth).where(RouteProviderHealth.name == name).with_for_update()
        )
        row = session.scalars(stmt).first()
        if row is None:
            try:
                with session.begin_nested():
                    session.add(
                        RouteProviderHealth(
                            name=name, status=HEALTHY, consecutive_failures=0, changed_at=now
                        )
                    )
            except sa.exc.IntegrityError:
                pass  # another process created it first
            row = session.scalars(stmt).one()
        return row

    def _emit_degraded(self, session: Session, row: RouteProviderHealth, now: datetime) -> None:
        """`route.provider_degraded` to every tenant with deposit accounts (a platform notice)."""
        data = {"provider": provider_document(row)}
        tenants = session.scalars(sa.select(DepositAccount.tenant_id).distinct())
        for tenant_id in tenants:
            outbox.emit(session, events.ROUTE_PROVIDER_DEGRADED, tenant_id, data, created_at=now)
        log.warning("route provider %s degraded: %s", row.name, row.reason)

    # -- inventory setup ---------------------------------------------------------------

    def seed_inventory(self, db: Database, seeds: Sequence[InventorySeed], now: datetime) -> None:
        """Create inventory rows from settings; balances already tracked are kept."""
        with db.transaction() as session:
            for seed in seeds:
                chain = self.registry.get(seed.chain_id)
                asset = chain.asset_by_symbol(seed.asset) if chain else None
                if chain is None or asset is None:
                    log.error(
                        "SETTLE_INVENTORY: %s on chain %s is not known", seed.asset, seed.chain_id
                    )
                    continue
                if session.get(InventoryBalance, (seed.chain_id, asset.token_address)) is None:
                    with session.begin_nested():
                        session.add(
                            InventoryBalance(
                                chain_id=seed.chain_id,
                                token_address=asset.token_address,
                                asset=asset.symbol,
                                balance=str(seed.balance),
                                low_threshold=str(seed.low_threshold),
                                low_alerted=False,
                                updated_at=now,
                            )
                        )


def set_inventory(
    session: Session,
    chain_id: int,
    token_address: str,
    asset: str,
    balance: Decimal,
    low_threshold: Decimal,
    now: datetime,
) -> InventoryBalance:
    """Create or overwrite a tracked balance (ops top-ups, tests)."""
    row = session.get(InventoryBalance, (chain_id, token_address), with_for_update=True)
    if row is None:
        row = InventoryBalance(chain_id=chain_id, token_address=token_address)
        session.add(row)
    row.asset = asset
    row.balance = str(balance)
    row.low_threshold = str(low_threshold)
    row.low_alerted = balance < low_threshold and bool(row.low_alerted)
    row.updated_at = now
    session.flush()
    return row


def inventory_document(row: InventoryBalance) -> dict[str, object]:
    return {
        "chainId": row.chain_id,
        "asset": row.asset,
        "tokenAddress": row.token_address,
        "balance": row.balance,
        "lowThreshold": row.low_threshold,
        "updatedAt": iso_ms(row.updated_at),
    }


def provider_document(row: RouteProviderHealth) -> dict[str, object]:
    return {
        "name": row.name,
        "status": row.status,
        "reason": row.reason,
        "consecutiveFailures": row.consecutive_failures,
        "since": iso_ms(row.changed_at),
    }
