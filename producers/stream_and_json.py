"""Streaming text and structured output: the two things a pipeline most often asks of a model.

    python producers/stream_and_json.py

Prints a list as the model writes it, then asks for a JSON object that matches a
schema and prints the parsed value. Both go through the high-priority lane with
a deadline: if the model cannot start within 30 s, the answer is `error:expired`
and nothing runs. Finds the server as the `laya` commands do.
"""

from laya import Chunk, Client, load_settings

settings = load_settings()
client = Client.from_url(settings.redis.effective_url, prefix=settings.redis.prefix)

for item in client.stream("Three reasons to retry a failed job:\n1.", max_tokens=48, priority="high", deadline_s=30):
    if isinstance(item, Chunk):
        print("" if item.reset else item.text, end="", flush=True)
    else:
        print(f"\n[{item.route}, finish_reason {item.finish_reason}]")

person = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0,
                                                                      "maximum": 130}},
    "required": ["name", "age"],
}
result = client.ask("Ada Lovelace, 36 years old, as JSON:", max_tokens=64, priority="high",
                    deadline_s=30, response_format={"type": "json_schema", "schema": person}, timeout=120)
print(result.json_value if result.ok else f"{result.route}: {result.error}")
