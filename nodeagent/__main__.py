"""``reclaimnet-agent --config agent.json`` (or ``python -m nodeagent``); ``--check-config FILE`` only validates.

Exit status: 0 ran / config valid, 2 configuration error (the message names the field), 3 token refused by
the portal (design §1, §18)."""

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
    p = argparse.ArgumentParser(prog="reclaimnet-agent", description="ReclaimNet node agent (design §1, §18)")
    p.add_argument("--config", help="JSON config file (keys as in nodeagent.config.AgentConfig)")
    p.add_argument("--check-config", dest="check_config", metavar="FILE",
                   help="validate FILE (with the other options applied), print the result and exit 0 or 2")
    p.add_argument("--portal", action="append",
                   help="portal URL, e.g. ws://127.0.0.1:8000/ws/agent/ (http:// accepted); repeat it to list "
                        "several daphne processes, tried in turn (design §18)")
    p.add_argument("--token", help="the node's agent token (or token_file / RECLAIMNET_AGENT_TOKEN)")
    p.add_argument("--data-dir", dest="data_dir")
    p.add_argument("--data-host", dest="data_host")
    p.add_argument("--data-port", dest="data_port", type=int)
    p.add_argument("--simulate-gpus", dest="simulate_gpus", help="count, or a JSON list of GPUs")
    p.add_argument("--base-dir", dest="base_dir")
    p.add_argument("--allow-unconfined-jobs", dest="allow_unconfined_jobs", action="store_true", default=None,
                   help="run jobs even where they cannot be confined (no cgroup, or as the agent's own user; "
                        "design §19.6): allow_unconfined_jobs in the config")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides: dict[str, Any] = {k: getattr(args, k) for k in
                                 ("portal", "token", "data_dir", "data_host", "data_port", "base_dir",
                                  "allow_unconfined_jobs")}
    if args.simulate_gpus is not None:
        try:
            overrides["simulate_gpus"] = json.loads(args.simulate_gpus)
        except ValueError:
            print("error: --simulate-gpus must be a count or a JSON list", file=sys.stderr)
            return 2
    config_path = args.check_config or args.config
    try:
        file_values = load_config_file(config_path) if config_path else {}
        config = build_config(file_values, overrides, strict_token_file=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"{args.check_config}: ok (portal {', '.join(config.portal_urls)}, data_dir {config.data_dir}, "
              f"enforcement {config.enforcement})")
        return 0
    try:
        agent = Agent(config)
    except ConfigError as exc:  # confinement (design §19): a job user that cannot reach data_dir, no cgroups
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def _run() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, agent.shutdown)
        return await agent.run()

    return asyncio.run(_run())


if __name__ == "__main__":
    raise SystemExit(main())
