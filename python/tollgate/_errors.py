"""tollgate's exceptions. The Rust side raises these with the Rust message."""

from typing import Optional


class TollgateError(Exception):
    """Base of tollgate's own errors (a bad rate string, a bad argument, or conflicting
    limits raise ``ValueError`` instead)."""


class Timeout(TollgateError, TimeoutError):
    """The call's turn would come after its deadline. Nothing was charged.

    ``waited``: seconds it waited; ``needed``: seconds more it would have needed, when known.
    """

    def __init__(
        self,
        message: str,
        key: Optional[str] = None,
        waited: Optional[float] = None,
        needed: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.waited = waited
        self.needed = needed

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TooLarge(TollgateError, ValueError):
    """A cost above a window's burst: waiting can never admit it. Raise the burst, or split
    the call."""

    def __init__(
        self,
        message: str,
        key: Optional[str] = None,
        cost: Optional[int] = None,
        capacity: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.cost = cost
        self.capacity = capacity


class StoreError(TollgateError):
    """The store (Redis) could not be reached, did not answer in time, or refused."""


class QueueFull(TollgateError):
    """Too many calls already wait on the key."""
