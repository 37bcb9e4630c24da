#!/usr/bin/env python3
"""Measures idemgate's memory under guarded request bodies that stall one byte short.

Usage: scripts/stalled-bodies.py [BINARY] [--bodies N] [--size BYTES] [--extra YAML]

Starts BINARY (default target/release/idemgate) on a free loopback port with the memory
store, opens N connections (default 300) that each send a guarded POST whose body of
SIZE bytes (default 1 MiB) stops one byte short, and prints the process's RSS before and
after, how many were refused with 503 overloaded, and what /metrics says is buffered.
Everything it starts is stopped before it exits. Loopback only.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


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


def metric(admin_port, name):
    with socket.create_connection(("127.0.0.1", admin_port), timeout=2) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    for line in data.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return line.split()[-1]
    return "?"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary", nargs="?", default="target/release/idemgate")
    parser.add_argument("--bodies", type=int, default=300)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--extra", default="", help="YAML appended to the config")
    args = parser.parse_args()

    port, admin, closed = free_port(), free_port(), free_port()
    config = (
        f"listen: 127.0.0.1:{port}\n"
        f"upstream:\n  url: http://127.0.0.1:{closed}\n  timeout: 300s\n"
        f"admin:\n  listen: 127.0.0.1:{admin}\n"
        f"idempotency:\n  max_request_body: {args.size}\n"
        f"log:\n  level: error\n{args.extra}"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config)
        path = f.name
    proc = subprocess.Popen([args.binary, "--config", path], stderr=subprocess.DEVNULL)
    conns = []
    try:
        wait_listening(port, proc)
        before = rss_kib(proc.pid)
        body = b" " * (args.size - 1)
        for i in range(args.bodies):
            s = socket.create_connection(("127.0.0.1", port))
            head = (
                f"POST /charges HTTP/1.1\r\nhost: t\r\nidempotency-key: stall-{i}\r\n"
                f"content-type: application/json\r\ncontent-length: {args.size}\r\n\r\n"
            ).encode()
            s.settimeout(5)
            try:
                s.sendall(head + body)
            except OSError:
                pass
            conns.append(s)
        # Let the proxy read what it was sent; this is a measurement, not a test.
        time.sleep(2.0)
        after = rss_kib(proc.pid)
        refused = 0
        for s in conns:
            s.setblocking(False)
            try:
                if s.recv(64).startswith(b"HTTP/1.1 503"):
                    refused += 1
            except OSError:
                pass
        buffered = metric(admin, "idemgate_buffered_bytes")
        print(f"bodies: {args.bodies} x {args.size} bytes, each stalled one byte short")
        print(f"RSS before: {before / 1024:.0f} MiB")
        print(f"RSS with the bodies held: {after / 1024:.0f} MiB")
        print(f"refused with 503 overloaded: {refused}")
        print(f"idemgate_buffered_bytes: {buffered}")
    finally:
        for s in conns:
            s.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(path)


if __name__ == "__main__":
    main()
