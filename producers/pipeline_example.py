"""An automation pipeline: classify support tickets with the model, many at once.

Submits every ticket with one shared reply channel, then collects results as
they arrive. Tickets a rule recognises are answered by the router at once
(with the example rules: "hello" and the opening-hours question); the rest
queue for the GPU worker. Rules look at the ticket itself (the last user
message), so the instruction goes in a system message.

Start Laya with a config that names the example rules, for example

    laya -c configs/cpu-only.toml up

(every shipped config uses configs/routes.example.toml; a plain `laya up` has
no rules and logs so), then, from another terminal:

    python producers/pipeline_example.py

It finds the server as the `laya` commands do: $LAYA_CONFIG, LAYA_REDIS_URL,
else the embedded server of `laya up` on port 6390.
"""

from laya import Client, load_settings

TICKETS = [
    "My invoice shows the wrong amount, please fix it.",
    "What are your opening hours?",
    "The app crashes when I upload a photo.",
    "hello",
    "Summarize: customer wants a refund for a late delivery.",
]

settings = load_settings()
client = Client.from_settings(settings)
channel = client.new_channel()
ids = client.submit_many(
    ({"messages": [{"role": "system", "content": "Classify this support ticket in one word."},
                   {"role": "user", "content": ticket}],
      "max_tokens": 8, "metadata": {"ticket": n}}
     for n, ticket in enumerate(TICKETS)),
    reply_to=channel,
)
for result in client.wait_many(ids, channel, timeout=300):
    print(f"ticket {result.metadata.get('ticket')}: [{result.route}] {result.text or result.error}")
