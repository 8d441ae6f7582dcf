"""Reads one JSON object per line on stdin, {"boundary": B, "body": BODY}
(BODY an ASCII string), parses BODY as a multipart/mixed message with that
boundary using Python's standard `email` package (RFC 2046), and writes one
JSON line per input: {"parts": [{"headers": [[NAME, VALUE], ...],
"content": TEXT}, ...]} or {"parts": null} when email finds no parts.

Used by sidecar/tests/integration/multipart_differential.rs: the sidecar must split a
multipart body into exactly the parts another RFC 2046 parser sees."""

import email
import email.policy
import json
import sys


def parts(boundary, body):
    head = 'Content-Type: multipart/mixed; boundary="%s"\r\n\r\n' % boundary
    msg = email.message_from_bytes(
        head.encode("ascii") + body.encode("ascii"), policy=email.policy.compat32
    )
    payload = msg.get_payload()
    if not isinstance(payload, list):
        return None
    out = []
    for part in payload:
        content = part.get_payload()
        if not isinstance(content, str):
            return None
        headers = [[name, value.strip()] for name, value in part.items()]
        out.append({"headers": headers, "content": content})
    return out


for line in sys.stdin:
    case = json.loads(line)
    print(json.dumps({"parts": parts(case["boundary"], case["body"])}), flush=True)
