#!/bin/sh
# A long-running handler in POSIX shell for `precedent work QUEUE --process -- sh ship.sh`
# (docs/queues.md, "Long-running handlers"). It skips the hello line and answers each
# request with a `Shop.Shipped` completion naming the input, read with sed (no jq needed:
# the request's keys come in a fixed order, "lease" first and the input's "hash" first).
read -r hello
while read -r request; do
    lease=$(printf '%s\n' "$request" | sed 's/^{"lease":\([0-9]*\),.*/\1/')
    hash=$(printf '%s\n' "$request" | sed 's/.*"input":{"hash":"\([0-9a-f]*\)".*/\1/')
    printf '{"lease":%s,"outcome":"done","facts":[{"type":"Shop.Shipped","fields":{},"predecessors":{"order":"%s"}}]}\n' "$lease" "$hash"
done
