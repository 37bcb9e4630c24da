"""A Flask upstream for tests/it/real_upstreams.rs, run by Debian's python3-flask.

    /usr/bin/python3 tests/real/flask_app.py PORT

It listens on 127.0.0.1:PORT. Any path but /_seen is an API that wants credentials:
HTTP Basic `alice:secret`, or `Authorization: Bearer alice-token`; anything else is 401
with `WWW-Authenticate`. An authorized request executes: its counter, per
`Idempotency-Key` and user, goes up by one, and it answers 200 with JSON naming the user,
the key and that counter. `GET /_seen` reports, as JSON, every request received (method,
path, headers as they arrived) and the counters; it is the test's view of the upstream.
"""

import base64
import binascii
import sys
import threading

from flask import Flask, jsonify, request

USERS = {"alice": "secret"}
TOKENS = {"alice-token": "alice"}

app = Flask(__name__)
lock = threading.Lock()
# Every request but /_seen, in arrival order.
received = []
# "key user" -> executions.
executions = {}


def user_of(authorization):
    """The user the credentials prove, or None."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        if sep and USERS.get(user) == password:
            return user
        return None
    if scheme.lower() == "bearer":
        return TOKENS.get(value.strip())
    return None


@app.before_request
def record():
    request.get_data()  # read whole, so that a kept-alive connection stays in step
    if request.path != "/_seen":
        with lock:
            received.append(
                {
                    "method": request.method,
                    "path": request.full_path if request.query_string else request.path,
                    "headers": [[name.lower(), value] for name, value in request.headers],
                }
            )


@app.route("/_seen")
def seen():
    with lock:
        return jsonify({"received": received, "executions": executions})


@app.route("/<path:path>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
def api(path):
    user = user_of(request.headers.get("Authorization", ""))
    if user is None:
        response = jsonify({"error": "unauthorized"})
        response.status_code = 401
        response.headers["WWW-Authenticate"] = 'Basic realm="flask", Bearer realm="flask"'
        return response
    key = request.headers.get("Idempotency-Key", "")
    with lock:
        counter = f"{key} {user}"
        executions[counter] = executions.get(counter, 0) + 1
        execution = executions[counter]
    return jsonify({"user": user, "key": key, "path": "/" + path, "execution": execution})


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(sys.argv[1]), threaded=True, use_reloader=False)
