# Several HTTP requests in one run of python3 in a node's container (sparkctl/knowledge/serve_client.py, NodeFetch:
# one `docker exec` instead of one each). On stdin a JSON object: {"auth": the Authorization value or "", "tls": null
# or {"name": the name the certificate must hold, "ca": PEM or null for the image's roots}, "requests": [[method,
# url, body or null, timeout], ...]}. One JSON line per request, in order: [status, body (base64) or why nothing
# answered, seconds it took]; status 0: nothing answered. http.client, which uses no proxy whatever HTTP_PROXY the
# image sets (the server is on the head itself).
import base64
import http.client
import json
import ssl
import sys
import time
from urllib.parse import urlsplit

work = json.load(sys.stdin)
tls = work.get("tls")


class Verified(http.client.HTTPConnection):
    def connect(self):
        http.client.HTTPConnection.connect(self)
        context = ssl.create_default_context(cadata=tls["ca"]) if tls["ca"] else ssl.create_default_context()
        self.sock = context.wrap_socket(self.sock, server_hostname=tls["name"])


for method, url, body, timeout in work["requests"]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if work["auth"]:
        headers["Authorization"] = work["auth"]
    started = time.monotonic()
    connection = None
    try:
        parts = urlsplit(url)
        kind = Verified if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=timeout)
        connection.request(method, (parts.path or "/") + ("?" + parts.query if parts.query else ""),
                           body=body.encode() if body is not None else None, headers=headers)
        answer = connection.getresponse()
        code, out = answer.status, base64.b64encode(answer.read()).decode()
    except Exception as error:
        why = getattr(error, "verify_message", None) or getattr(error, "reason", None) or error
        code, out = 0, f"{type(error).__name__}: {why}"
    finally:
        if connection is not None:
            connection.close()
    print(json.dumps([code, out, time.monotonic() - started]), flush=True)
