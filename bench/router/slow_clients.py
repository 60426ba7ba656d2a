"""N raw-socket clients send a request header (mode `header`), or a full header and then a body (mode `body`),
at 1 byte/s to a server on loopback; prints how long until the server closed each connection, and what it
answered. With `zoe router` on PORT:

    python bench/router/slow_clients.py PORT 500 header     # closed at header_timeout_s
    python bench/router/slow_clients.py PORT 500 body       # closed at body_timeout_s
"""
import argparse
import asyncio
import json
import statistics
import time

_parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
_parser.add_argument("port", type=int, help="the server's port on 127.0.0.1")
_parser.add_argument("clients", type=int, help="connections opened at once")
_parser.add_argument("mode", choices=("header", "body"), help="which part is sent at 1 byte/s")
_args = _parser.parse_args()
HOST, PORT, N, MODE = "127.0.0.1", _args.port, _args.clients, _args.mode
HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n"

async def one():
    r, w = await asyncio.open_connection(HOST, PORT)
    t0 = time.monotonic()
    fast, slow = (b"", HEAD) if MODE == "header" else (HEAD, b"{" + b" " * 199)
    w.write(fast)
    got = b""
    async def feed():
        for b in slow:
            w.write(bytes([b]))
            await asyncio.sleep(1.0)
    f = asyncio.ensure_future(feed())
    try:
        while chunk := await r.read(4096):
            got += chunk
    except ConnectionError:
        pass
    f.cancel()
    w.close()
    return time.monotonic() - t0, got[:12]

async def main():
    res = await asyncio.gather(*(one() for _ in range(N)))
    secs = [x[0] for x in res]
    print(json.dumps({"mode": MODE, "clients": N, "closed_after_s": {"min": round(min(secs), 2),
          "median": round(statistics.median(secs), 2), "max": round(max(secs), 2)},
          "answers": sorted({x[1].decode() for x in res})}))


asyncio.run(main())
