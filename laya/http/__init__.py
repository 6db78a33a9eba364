"""The OpenAI-compatible HTTP front door (`laya serve`): a producer that speaks OpenAI's API."""
