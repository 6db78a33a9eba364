"""Laya: a local LLM job router on Redis and RQ.

Producers push requests into a Redis stream; the ingress router answers cache
hits and rule matches in microseconds and queues the rest as RQ jobs for one
single-concurrency GPU worker per GPU running llama-cpp-python.
"""

from laya.client import Client
from laya.config import Settings, load_settings
from laya.errors import LayaError
from laya.schema import Message, Request, Result

__all__ = ["Client", "LayaError", "Message", "Request", "Result", "Settings", "load_settings"]
__version__ = "0.1.0"
