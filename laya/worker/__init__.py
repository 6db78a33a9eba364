"""The GPU worker: the RQ worker, the llama.cpp backend, the job it runs, how it takes jobs."""

from __future__ import annotations

__all__ = ["LayaWorker", "plan_and_load", "resident_bytes", "run_worker"]


def __getattr__(name: str) -> object:
    """The public names of ``laya.worker.rqworker``, imported on first use: importing the package stays cheap."""
    if name in __all__:
        from laya.worker import rqworker

        return getattr(rqworker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
