"""The deposit pipeline: from an ERC-20 transfer (or a sandbox deposit) to a credited receipt.

watcher / sandbox -> service (state + outbox event in one transaction) -> settlement.
"""
