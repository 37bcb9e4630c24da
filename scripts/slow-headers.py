#!/usr/bin/env python3
"""Measures when idemgate closes connections that send no complete request head.

Usage: scripts/slow-headers.py [BINARY] [--timeout 2s]

Starts BINARY (default target/release/idemgate) with `listen_header_timeout` set to
TIMEOUT, opens on the proxy and on the admin listener a connection that sends nothing,
one that sends half an HTTP/2 preface, one that sends a whole preface and no request,
and one that sends half an HTTP/1 head, and prints how long each stayed open. Loopback
only; everything it starts is stopped before it exits.
"""

import argparse
import os
import select
import socket
import subprocess
import sys
import tempfile
import time

SENDS = {
    "nothing": b"",
    "half an HTTP/2 preface": b"PRI * HTTP/2.0\r\n",
    "HTTP/2 preface, no request": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    "half an HTTP/1 head": b"POST /charges HTTP/1.1\r\nhost: a",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, limit=10.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"idemgate exited: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    sys.exit("idemgate did not start")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary", nargs="?", default="target/release/idemgate")
    parser.add_argument("--timeout", default="2s")
    args = parser.parse_args()
    port, admin = free_port(), free_port()
    config = (
        f"listen: 127.0.0.1:{port}\nupstream:\n  url: http://127.0.0.1:{free_port()}\n"
        f"admin:\n  listen: 127.0.0.1:{admin}\nlisten_header_timeout: {args.timeout}\n"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config)
        path = f.name
    proc = subprocess.Popen([args.binary, "--config", path], stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        wait_listening(admin, proc)
        opened = {}
        for listener, p in (("proxy", port), ("admin", admin)):
            for what, data in SENDS.items():
                s = socket.create_connection(("127.0.0.1", p))
                s.sendall(data)
                opened[s] = (listener, what, time.monotonic())
        closed = {}
        deadline = time.monotonic() + 120
        while opened and time.monotonic() < deadline:
            ready, _, _ = select.select(list(opened), [], [], 1.0)
            for s in ready:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    listener, what, started = opened.pop(s)
                    closed[(listener, what)] = time.monotonic() - started
                    s.close()
        print(f"listen_header_timeout: {args.timeout}")
        for (listener, what), took in sorted(closed.items()):
            print(f"{listener:5}  {what:28} closed after {took:.2f} s")
        for s, (listener, what, _) in opened.items():
            print(f"{listener:5}  {what:28} still open after 120 s")
            s.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(path)


if __name__ == "__main__":
    main()
