"""A stand-in launcher for a vLLM of known speed: it takes vLLM's command line and serves the
OpenAI streaming endpoints with tokens at a fixed pace (:mod:`tests.stream_source`).

``paced_vllm.py --itl-ms 10 --model M --port P ...``: the options before the model are its
own, the rest is what the plugin appends (the config's vLLM flags are accepted and ignored).
Two of these with different paces are a reference and a candidate whose difference is known.
With ``--enable-sleep-mode`` (and dev mode, as vLLM wants) they sleep and wake as vLLM does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file by the plugin, from any folder

from tests.stream_source import serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--itl-ms", type=float, required=True, help="gap between tokens")
    parser.add_argument(
        "--ttft-ms", type=float, default=float(os.environ.get("PACED_TTFT_MS", "20")), help="delay to the first token (default: $PACED_TTFT_MS, else 20)"
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--enable-sleep-mode", action="store_true", help="vLLM's: with VLLM_SERVER_DEV_MODE=1, serve /sleep and /wake_up")
    args, _ = parser.parse_known_args()
    schedule = {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms}
    sleep_mode = args.enable_sleep_mode and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
    asyncio.run(serve(1, args.served_model_name or args.model, schedule, port=args.port, sleep_mode=sleep_mode))


if __name__ == "__main__":
    main()
