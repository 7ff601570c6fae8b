"""A stand-in launcher for lifecycle tests: a real HTTP server process that answers the
readiness endpoints like vLLM (requiring ``VLLM_API_KEY`` where vLLM does, when it is set)
and misbehaves on request (children that ignore SIGTERM, a grandchild that leaves the
process group, dying during boot).

It answers a plain (not streamed) ``/v1/completions`` as vLLM does with ``return_token_ids``
and ``logprobs``, with output ids that depend on the prompt alone, each moved by the sum of the
``--answer-shift`` options (given by a launcher, or by a config's flags): a model whose output
has changed.

It exists because vLLM itself cannot be told to misbehave; every test of the happy path
uses real vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUARDED = ("/v1", "/v2", "/inference", "/cohere")  # what vLLM 0.32's AuthenticationMiddleware guards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--children", type=int, default=0, help="sleeping children (each spawns one grandchild)")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--escape-group", action="store_true", help="grandchildren start their own session")
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--exit-during-boot", type=int, help="exit with this code instead of serving")
    parser.add_argument("--pid-file", help="append every pid of the tree to this file")
    parser.add_argument("--api-key", nargs="+", help="as vLLM's: wins over VLLM_API_KEY (the first key is checked)")
    parser.add_argument("--answer-shift", type=int, action="append", default=[], help="added to every output token id (summed)")
    args = parser.parse_args()

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit_during_boot is not None:
        print("WARNING [layers.py:1] fallback taken. Exception: harmless, not the cause", flush=True)
        print("ValueError: stand-in asked to fail during boot", flush=True)
        print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
        sys.exit(args.exit_during_boot)

    pids = [os.getpid()]
    for _ in range(args.children):
        # Each child is a small Python that itself starts a grandchild.
        child_code = (
            "import signal,subprocess,sys,time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if args.ignore_sigterm else "")
            + "g = subprocess.Popen([sys.executable, '-c', "
            + repr("import signal,time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if args.ignore_sigterm else "") + "time.sleep(3600)")
            + f"], start_new_session={args.escape_group})\n"
            + "print(g.pid, flush=True)\n"
            + "time.sleep(3600)\n"
        )
        child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE)
        assert child.stdout is not None
        pids += [child.pid, int(child.stdout.readline())]
    if args.pid_file:
        with open(args.pid_file, "a") as out:
            out.write("".join(f"{pid}\n" for pid in pids))

    name = args.served_model_name or args.model
    booted_at = time.monotonic() + args.ready_after
    api_key = (args.api_key or [os.environ.get("VLLM_API_KEY")])[0]  # as vLLM: a non-empty key guards GUARDED paths

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            pass

        def _send(self, status: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if time.monotonic() < booted_at:
                self._send(503, "{}")
            elif api_key and self.path.startswith(GUARDED) and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, json.dumps({"error": "Unauthorized"}))
            elif self.path == "/health":
                self._send(200, "")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": name, "max_model_len": 2048}]}))
            elif self.path == "/version":
                self._send(200, json.dumps({"version": "0.0.0-standin"}))
            elif self.path == "/metrics":
                self._send(200, 'vllm:cache_config_info{block_size="16",engine="0"} 1.0\n', "text/plain")
            else:
                self._send(404, "{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, json.dumps({"error": "Unauthorized"}))
            elif self.path != "/v1/completions" or body.get("stream"):
                self._send(404, "{}")
            elif body.get("model") != name:
                self._send(404, json.dumps({"error": {"message": f"The model `{body.get('model')}` does not exist."}}))
            else:
                ids = [(sum(str(body["prompt"]).encode()) + 7 * i + sum(args.answer_shift)) % 512 for i in range(int(body["max_tokens"]))]
                logprobs = {"token_logprobs": [-0.25] * len(ids), "tokens": [f"t{i}" for i in ids]}
                choice = {"index": 0, "text": " ".join(f"t{i}" for i in ids), "token_ids": ids, "logprobs": logprobs}
                self._send(200, json.dumps({"id": "cmpl-standin", "object": "text_completion", "choices": [choice]}))

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"stand-in serving {name} on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
