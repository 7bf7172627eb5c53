"""A fake Web Push service on loopback that checks what the broker sends
with the reference implementations: each message decrypted with the
subscription's private key by `http_ece` (RFC 8291, aes128gcm), its VAPID
JWT (RFC 8292) verified by `py_vapid` against the key the broker serves, its
`aud` the endpoint's origin, its `exp` within 24 hours.

    python3 fake_push.py PORT RECORD_FILE SERVED_KEY

prints, one line each, the subscriptions it offers (`ok` answers 201,
`gone` 410, `busy` 429 once then 201) as `PushManager.subscribe` gives
them, then serves until killed, appending one JSON line per message it got
to RECORD_FILE: the path, the decrypted payload, the checks' results.
"""

import base64
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import jwt as vapid_jwt


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


PORT, RECORD, SERVED_KEY = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ORIGIN = f"http://127.0.0.1:{PORT}"
KEYS = {}
for name in ("ok", "gone", "busy"):
    private = ec.generate_private_key(ec.SECP256R1())
    auth = os.urandom(16)
    KEYS[name] = (private, auth)
    public = private.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    print(json.dumps({"endpoint": f"{ORIGIN}/push/{name}", "keys": {"p256dh": b64(public), "auth": b64(auth)}}))
sys.stdout.flush()
BUSY = {"answered": False}


def check_vapid(header):
    """The claims of a valid VAPID header, or the reason it is not."""
    scheme, _, rest = header.partition(" ")
    if scheme.lower() != "vapid":
        return None, f"scheme {scheme}"
    parts = dict(p.strip().split("=", 1) for p in rest.split(","))
    if parts.get("k") != SERVED_KEY:
        return None, "k is not the served key"
    claims = vapid_jwt.decode(parts["t"], parts["k"])
    if claims.get("aud") != ORIGIN:
        return None, f"aud {claims.get('aud')}"
    if not time.time() < claims["exp"] <= time.time() + 24 * 3600:
        return None, f"exp {claims['exp']}"
    return claims, None


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        name = self.path.rsplit("/", 1)[-1]
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        record = {"path": self.path, "urgency": self.headers.get("Urgency"), "ttl": self.headers.get("TTL")}
        try:
            claims, problem = check_vapid(self.headers.get("Authorization", ""))
            record["vapid"] = problem or "ok"
            record["sub"] = claims and claims.get("sub")
            private, auth = KEYS[name]
            assert self.headers.get("Content-Encoding") == "aes128gcm"
            plain = http_ece.decrypt(body, private_key=private, auth_secret=auth, version="aes128gcm")
            record["payload"] = json.loads(plain)
        except Exception as error:  # recorded, and the test fails on it
            record["error"] = repr(error)
        status = 201
        if name == "gone":
            status = 410
        elif name == "busy" and not BUSY["answered"]:
            BUSY["answered"] = True
            status = 429
        record["status"] = status
        with open(RECORD, "a") as out:
            out.write(json.dumps(record) + "\n")
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
