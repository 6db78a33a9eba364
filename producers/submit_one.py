"""Submit one prompt and print the answer: the smallest producer.

    LAYA_REDIS_URL=redis://127.0.0.1:6390/0 python producers/submit_one.py "Summarize: ..."
"""

import os
import sys

from laya import Client

client = Client.from_url(os.environ.get("LAYA_REDIS_URL", "redis://127.0.0.1:6390/0"))
result = client.ask(" ".join(sys.argv[1:]) or "hello", max_tokens=64, timeout=120)
print(f"[{result.route}] {result.text if result.ok else result.error}")
