"""The name → class registry of the norms: :func:`register_norm`, :func:`create_norm` and friends.

The norm modules of this package register their classes when :mod:`autonorm_core.norms` is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

_NORM_REGISTRY: dict[str, type[nn.Module]] = {}

_M = TypeVar("_M", bound=type[nn.Module])


def register_norm(name: str) -> Callable[[_M], _M]:
    """Class decorator that makes a norm available to :func:`create_norm` under ``name``.

    The shared contract suite (``tests/core/test_norms_contract.py``) runs over :func:`list_norms`,
    so a newly registered norm is tested without further wiring.

    Raises:
        ValueError: if ``name`` is already registered (silently replacing a layer would change every
            study that names it).
    """

    def decorator(cls: _M) -> _M:
        if name in _NORM_REGISTRY:
            raise ValueError(f"norm {name!r} is already registered to {_NORM_REGISTRY[name].__name__}")
        _NORM_REGISTRY[name] = cls
        return cls

    return decorator


def list_norms() -> list[str]:
    """Names accepted by :func:`create_norm`, sorted."""
    return sorted(_NORM_REGISTRY)


def get_norm_layer(name: str) -> type[nn.Module]:
    """Return the norm class registered under ``name`` (a type, not an instance).

    Raises:
        ValueError: for an unknown name; the message lists the valid names.
    """
    try:
        return _NORM_REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown norm {name!r}; valid names: {', '.join(list_norms())}") from None


def create_norm(name: str, dim: int, **kwargs: Any) -> nn.Module:
    """Instantiate the norm registered under ``name`` for ``dim`` channels.

    Args:
        name: a registry name, see :func:`list_norms`.
        dim: number of channels (size of the last input dimension).
        **kwargs: keyword options of that norm's constructor.

    Raises:
        ValueError: for an unknown name (listing the valid ones) or an invalid option value.
    """
    return get_norm_layer(name)(dim, **kwargs)
