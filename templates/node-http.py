# One HTTP request from inside a container on a node (sparkctl/knowledge/serve_client.py, node_http_command: doctor's
# probes and the serve tasks run it in the head's container, which shares the host's network). argv: method, url,
# timeout; on stdin (never argv) the Authorization value on the first line (empty: none), then the request body.
# Prints the status (0: nothing answered) on the first line, then the body or the error. No proxy: the server is on
# the head itself, whatever HTTP_PROXY the image sets.
import sys
import urllib.error
import urllib.request

method, url, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
auth = sys.stdin.buffer.readline().strip().decode()
data = sys.stdin.buffer.read() if method == "POST" else None
headers = {"Content-Type": "application/json"} if data else {}
if auth:
    headers["Authorization"] = auth
try:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    answer = opener.open(urllib.request.Request(url, data=data, method=method, headers=headers), timeout=timeout)
    code, body = answer.getcode(), answer.read()
except urllib.error.HTTPError as error:
    code, body = error.code, error.read()
except Exception as error:
    code, body = 0, f"{type(error).__name__}: {getattr(error, 'reason', error)}".encode()
sys.stdout.write(f"{code}\n")
sys.stdout.flush()
sys.stdout.buffer.write(body)
