"""Submit one prompt and print the answer: the smallest producer.

    python producers/submit_one.py "Summarize: the queue is the backpressure"

It finds the server as the `laya` commands do: $LAYA_CONFIG, LAYA_REDIS_URL,
else the embedded server of `laya up` on port 6390.
"""

import sys

from laya import Client, load_settings

settings = load_settings()
client = Client.from_settings(settings)
result = client.ask(" ".join(sys.argv[1:]) or "hello", max_tokens=64, timeout=120)
print(f"[{result.route}] {result.text if result.ok else result.error}")
