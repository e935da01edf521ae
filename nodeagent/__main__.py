"""``python -m nodeagent --portal URL --token TOKEN`` or ``python -m nodeagent --config agent.json``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any

from nodeagent.agent import Agent
from nodeagent.config import ConfigError, build_config, load_config_file


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m nodeagent", description="ReclaimNet node agent")
    p.add_argument("--config", help="JSON config file (keys as in nodeagent.config.AgentConfig)")
    p.add_argument("--portal", help="portal URL, e.g. ws://127.0.0.1:8000/ws/agent/ (http:// accepted)")
    p.add_argument("--token", help="the node's agent token (or token_file / RECLAIMNET_AGENT_TOKEN)")
    p.add_argument("--data-dir", dest="data_dir")
    p.add_argument("--data-host", dest="data_host")
    p.add_argument("--data-port", dest="data_port", type=int)
    p.add_argument("--simulate-gpus", dest="simulate_gpus", help="count, or a JSON list of GPUs")
    p.add_argument("--base-dir", dest="base_dir")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides: dict[str, Any] = {k: getattr(args, k) for k in
                                 ("portal", "token", "data_dir", "data_host", "data_port", "base_dir")}
    if args.simulate_gpus is not None:
        try:
            overrides["simulate_gpus"] = json.loads(args.simulate_gpus)
        except ValueError:
            print("error: --simulate-gpus must be a count or a JSON list", file=sys.stderr)
            return 2
    try:
        file_values = load_config_file(args.config) if args.config else {}
        config = build_config(file_values, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    agent = Agent(config)

    async def _run() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, agent.shutdown)
        return await agent.run()

    return asyncio.run(_run())


if __name__ == "__main__":
    raise SystemExit(main())
