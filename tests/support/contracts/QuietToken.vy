# pragma version ~=0.4.3
"""
@title QuietToken
@notice TestToken, except that once the deployer sets `quiet`, `transfer` moves nothing
        and answers `False` instead of reverting (as some real tokens do on a failure):
        the transaction succeeds (status 1) with no Transfer log.
"""

event Transfer:
    sender: indexed(address)
    receiver: indexed(address)
    value: uint256

event Approval:
    owner: indexed(address)
    spender: indexed(address)
    value: uint256

name: public(String[64])
symbol: public(String[32])
decimals: public(uint8)
totalSupply: public(uint256)
balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])
minter: public(address)
quiet: public(bool)


@deploy
def __init__(_name: String[64], _symbol: String[32], _decimals: uint8):
    self.name = _name
    self.symbol = _symbol
    self.decimals = _decimals
    self.minter = msg.sender


@internal
def _transfer(_from: address, _to: address, _value: uint256):
    assert _to != empty(address), "transfer to zero address"
    # Checked arithmetic: an insufficient balance reverts on underflow.
    self.balanceOf[_from] -= _value
    self.balanceOf[_to] += _value
    log Transfer(sender=_from, receiver=_to, value=_value)


@external
def transfer(_to: address, _value: uint256) -> bool:
    if self.quiet:
        return False
    self._transfer(msg.sender, _to, _value)
    return True


@external
def set_quiet(_quiet: bool):
    assert msg.sender == self.minter, "only the deployer sets quiet"
    self.quiet = _quiet


@external
def transferFrom(_from: address, _to: address, _value: uint256) -> bool:
    # Underflow reverts when the allowance is too small.
    self.allowance[_from][msg.sender] -= _value
    self._transfer(_from, _to, _value)
    return True


@external
def approve(_spender: address, _value: uint256) -> bool:
    self.allowance[msg.sender][_spender] = _value
    log Approval(owner=msg.sender, spender=_spender, value=_value)
    return True


@external
def mint(_to: address, _value: uint256):
    assert msg.sender == self.minter, "only the deployer mints"
    assert _to != empty(address), "mint to zero address"
    self.totalSupply += _value
    self.balanceOf[_to] += _value
    log Transfer(sender=empty(address), receiver=_to, value=_value)
