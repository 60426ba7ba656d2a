"""Stand-in for a multi-node engine (SGLang-style flags) in the gang tests: only the launch contract matters.

Node rank 0 answers /health on --host:--port; other ranks only run (as SGLang's non-zero ranks do). Every rank
prints the flags and GPUs it got, which the test reads back through `zoe logs`.
"""

from __future__ import annotations

import argparse
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path in ("/health", "/metrics") else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr")
    a, _ = p.parse_known_args()
    print(f"rank {a.node_rank}/{a.nnodes} dist-init-addr {a.dist_init_addr} "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    if a.node_rank == 0:
        ThreadingHTTPServer((a.host, a.port), Health).serve_forever()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
