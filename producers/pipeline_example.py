"""An automation pipeline: classify support tickets with the model, many at once.

Submits every ticket with one shared reply channel, then collects results as
they arrive. Tickets a rule recognises are answered by the router at once;
the rest queue for the GPU worker.

    LAYA_REDIS_URL=redis://127.0.0.1:6390/0 python producers/pipeline_example.py
"""

import os

from laya import Client

TICKETS = [
    "My invoice shows the wrong amount, please fix it.",
    "What are your opening hours?",
    "The app crashes when I upload a photo.",
    "hello",
    "Summarize: customer wants a refund for a late delivery.",
]

client = Client.from_url(os.environ.get("LAYA_REDIS_URL", "redis://127.0.0.1:6390/0"))
channel = client.new_channel()
ids = client.submit_many(
    ({"prompt": f"Classify this support ticket in one word: {t}", "max_tokens": 8, "metadata": {"ticket": n}}
     for n, t in enumerate(TICKETS)),
    reply_to=channel,
)
for result in client.wait_many(ids, channel, timeout=300):
    print(f"ticket {result.metadata.get('ticket')}: [{result.route}] {result.text or result.error}")
