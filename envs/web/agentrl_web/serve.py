"""Serve one app standalone: `python -m agentrl_web.serve shop --port 8001 [--seed 0]`.

Envs then browse it with `make("web/Shop-v0", base_url="http://127.0.0.1:8001")`; the seed must
match the env's (`world_seed`), since the env draws its tasks from the same generated data.
"""

from __future__ import annotations

import argparse

import uvicorn
from agentrl_web.server import APPS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentrl_web.serve", description=__doc__.splitlines()[0])
    parser.add_argument("app", choices=sorted(APPS))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0, help="catalogue / world seed (default 0)")
    args = parser.parse_args(argv)
    uvicorn.run(
        APPS[args.app](args.seed), host=args.host, port=args.port, log_level="warning", access_log=False
    )


if __name__ == "__main__":
    main()
