#!/usr/bin/env python3
"""A minimal OTLP/HTTP trace receiver that prints what it gets, one line per span.

scripts/compose-test.sh puts it in its stand-in for the `otel-collector` image of
docker-compose.yml when no registry can provide the real OpenTelemetry Collector.
It takes the collector's command line (`--config=FILE`), reads the `http` receiver's
`endpoint` from that file (deploy/otel-collector.yaml: 0.0.0.0:4318) and answers
`POST /v1/traces` (http/protobuf, what config/docker.yaml sends) with 200 and an empty
ExportTraceServiceResponse. The `grpc` receiver (4317) is not served. Standard library
only: the stand-in image is Debian's python3 and nothing else.
"""

import gzip
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 16 * 1024 * 1024


def fields(buf):
    """(field number, wire type, value) of each field of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 2:
            size, i = varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def attributes(message, number):
    """The string, bool and int attributes (KeyValue) in field `number` of `message`."""
    out = {}
    for n, wire, kv in fields(message):
        if n != number or wire != 2:
            continue
        key, value = "", ""
        for f, w, v in fields(kv):
            if f == 1 and w == 2:
                key = v.decode(errors="replace")
            elif f == 2 and w == 2:
                # AnyValue: 1 string, 2 bool, 3 int.
                for g, x, s in fields(v):
                    if g == 1 and x == 2:
                        value = s.decode(errors="replace")
                    elif g == 2 and x == 0:
                        value = "true" if s else "false"
                    elif g == 3 and x == 0:
                        value = str(s - (1 << 64) if s >= 1 << 63 else s)
        out[key] = value
    return out


def spans(request):
    """(service.name, span name, string attributes) of an ExportTraceServiceRequest."""
    for n, _, resource_spans in fields(request):
        if n != 1:
            continue
        service = "?"
        for f, _, v in fields(resource_spans):
            if f == 1:
                service = attributes(v, 1).get("service.name", "?")
            elif f == 2:
                # ScopeSpans: 2 is a Span, whose 5 is its name and 9 its attributes.
                for g, _, span in fields(v):
                    if g == 2:
                        name = next((s for h, w, s in fields(span) if h == 5 and w == 2), b"")
                        yield service, name.decode(errors="replace"), attributes(span, 9)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        size = int(self.headers.get("Content-Length") or 0)
        if self.path != "/v1/traces" or size > MAX_BODY:
            self.send_response(404 if self.path != "/v1/traces" else 413)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.rfile.read(size)
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            got = list(spans(body))
        except (IndexError, ValueError) as e:
            print(f"otlp-sink: {len(body)} bytes that are not an OTLP trace request: {e}", flush=True)
            got = []
        for service, name, attrs in got:
            shown = " ".join(f"{k}={v}" for k, v in sorted(attrs.items()) if k.startswith("idempotency."))
            print(f"otlp-sink: span service.name={service} name={name!r} {shown}".rstrip(), flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format, *args):
        pass


def endpoint(argv):
    """The http receiver's endpoint from the collector's --config file; 0.0.0.0:4318."""
    for arg in argv:
        if arg.startswith("--config="):
            with open(arg.split("=", 1)[1], encoding="utf-8") as f:
                m = re.search(r"^\s*http:\s*\n\s*endpoint:\s*(\S+):(\d+)\s*$", f.read(), re.M)
            if m:
                return m.group(1), int(m.group(2))
    return "0.0.0.0", 4318


if __name__ == "__main__":
    host, port = endpoint(sys.argv[1:])
    print(f"otlp-sink: a stand-in for the OpenTelemetry Collector (scripts/compose-test.sh); "
          f"OTLP/HTTP traces on {host}:{port}, printed one line per span", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()
