"""The ingress router: the stages a request goes through, and what they use."""

from __future__ import annotations

__all__ = ["Flight", "Router", "run_router"]


def __getattr__(name: str) -> object:
    """The public names of ``laya.router.ingress``, imported on first use: importing the package stays cheap."""
    if name in __all__:
        from laya.router import ingress

        return getattr(ingress, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
