"""The deposit pipeline: from an ERC-20 transfer (or a sandbox deposit) to a credited receipt.

watcher / sandbox -> detection -> settling (rules decide; transitions write state + outbox
event in one transaction) -> settlement routes; ops and queries beside them.
"""
