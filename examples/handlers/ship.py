#!/usr/bin/env python3
"""A long-running handler for `precedent work QUEUE --process -- python3 ship.py`.

Reads the protocol's lines on stdin (docs/queues.md, "Long-running handlers"): first a
hello line, then one request per input. Answers each input with one line on stdout: a
`Shop.Shipped` fact naming the order as its completion, or poison for an order with no
"id" field. Logs go to stderr, never stdout.
"""
import json
import sys


def answer(request):
    order = request["input"]
    if "id" not in order["fields"]:
        return {"lease": request["lease"], "outcome": "poison", "reason": "order without an id"}
    shipped = {
        "type": "Shop.Shipped",
        "fields": {"id": order["fields"]["id"], "attempt": request["attempt"]},
        "predecessors": {"order": order["hash"]},
    }
    return {"lease": request["lease"], "outcome": "done", "facts": [shipped]}


def main():
    hello = json.loads(sys.stdin.readline())
    if hello.get("version") != 1:
        sys.exit(f"unsupported protocol version {hello.get('version')}")
    print(f"ship.py serving queue {hello['queue']}", file=sys.stderr)
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
