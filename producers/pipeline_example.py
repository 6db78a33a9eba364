"""An automation pipeline: answer a list of questions with the model, many at once.

Submits every question with one shared reply channel, then collects results as
they arrive. Questions a rule recognises are answered by the router at once
(with the example rules: "hello" and the opening-hours question); the rest
queue for the GPU worker. Rules look at the question itself (the last user
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

QUESTIONS = [
    "What is the capital of Japan?",
    "What are your opening hours?",
    "What do bees make?",
    "hello",
    "What is the capital of Germany?",
]

settings = load_settings()
client = Client.from_settings(settings)
channel = client.new_channel()
ids = client.submit_many(
    ({"messages": [{"role": "system", "content": "Answer in a few words."},
                   {"role": "user", "content": question}],
      "max_tokens": 16, "metadata": {"question": n}}
     for n, question in enumerate(QUESTIONS)),
    reply_to=channel,
)
for result in client.wait_many(ids, channel, timeout=300):
    print(f"question {result.metadata.get('question')}: [{result.route}] {result.text or result.error}")
