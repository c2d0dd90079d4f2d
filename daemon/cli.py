"""The `pegainfer` command line: parses arguments, dispatches to a subcommand, and turns the errors
a user can fix into one line on stderr with a non-zero exit status: 2 for a command line, settings or
host that cannot work (nothing was bound or loaded; restarting will not help), 1 for a failure while
running."""
from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from typing import NoReturn

from pegainfer.daemon.errors import CliError
from pegainfer.daemon.settings import DTYPES, SettingsError, device_arg
from pegainfer.engine.config import ConfigError
from pegainfer.engine.contract import ParamError
from pegainfer.engine.engine import RequestError
from pegainfer.engine.tokenizer import TokenizerError
from pegainfer.engine.weights import WeightsError
from pegainfer.ep.launch import EPStartError
from pegainfer.ep.nccl_runtime import NcclRuntimeError
from pegainfer.ep.ownership import OwnershipError
from pegainfer.ep.registry import TestOnlyBackend, UnknownBackend, user_backends
from pegainfer.telemetry.logs import configure_logging

# Errors whose message is the whole story for a user: no traceback. The first kind is found before
# anything is bound or loaded (exit 2), the second while running (exit 1).
USAGE_ERRORS = (CliError, SettingsError, UnknownBackend, TestOnlyBackend, NcclRuntimeError)
USER_ERRORS = (EPStartError, ConfigError, WeightsError, TokenizerError, RequestError, OwnershipError,
               FileNotFoundError, ParamError)
BACKENDS = "{" + ",".join(user_backends()) + "}"


class Parser(argparse.ArgumentParser):
    """argparse, except that a bad command line is one line on stderr, not the usage text too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return importlib.metadata.version("pegainfer")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="DIR", help="HF checkpoint folder (default: the embedded tiny model)")
    p.add_argument("--device", default="cpu", type=device_arg, metavar="{cpu,cuda,cuda:N}", help="default cpu")
    p.add_argument("--dtype", choices=DTYPES, help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--backend", default="local", metavar=BACKENDS, help="EP backend (default local)")
    p.add_argument("--ep-size", type=int, default=1, help="expert-parallel ranks (default 1)")
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                   help="the output never depends on the batch around it (default on)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pegainfer", description="DeepSeek-V2 expert-parallel inference")
    parser.add_argument("--version", action="version", version=f"pegainfer {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generation for one prompt, offline (greedy unless --temperature)")
    _engine_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (a BOS token is prepended)")
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids, used as given")
    g.add_argument("--max-tokens", type=int, required=True)
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the EOS token")
    g.add_argument("--temperature", type=float, help="0 (the default): greedy; above 0: sampled")
    g.add_argument("--top-p", type=float, help="nucleus sampling: the smallest set of tokens of this mass")
    g.add_argument("--top-k", type=int, help="sample among the k most likely tokens (-1 or 0: off)")
    g.add_argument("--min-p", type=float, help="drop tokens below this fraction of the top token's probability")
    g.add_argument("--seed", type=int, help="the draws' seed (default 0): the same seed, the same tokens")
    g.add_argument("--json", action="store_true", help="print one JSON object")

    w = sub.add_parser("expert-worker", help="join an EP group as an expert-only rank (multi-host)")
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--world-size", type=int, required=True)
    w.add_argument("--master-addr", required=True, help="rank 0's address (its --ep-master-addr)")
    w.add_argument("--master-port", type=int, default=29500)
    w.add_argument("--model", help="the same checkpoint folder rank 0 serves")
    w.add_argument("--random-preset", help="the same random preset rank 0 serves (tiny|lite)")
    w.add_argument("--backend", default="host-staged", metavar=BACKENDS, help="default host-staged")
    w.add_argument("--device", default="cpu", type=device_arg, metavar="{cpu,cuda,cuda:N}", help="default cpu")
    w.add_argument("--dtype", choices=DTYPES)
    w.add_argument("--join-timeout", type=float, default=300.0)
    w.add_argument("--num-threads", type=int, help="CPU threads; match rank 0's for bit-exact CPU results")

    from pegainfer.daemon.settings import add_flags
    sv = sub.add_parser("serve", help="serve OpenAI-compatible /v1/completions over HTTP")
    add_flags(sv)

    from pegainfer.daemon.install_service import add_arguments
    ins = sub.add_parser("install-service", help="install the systemd unit, example config and service account")
    add_arguments(ins)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "install-service":  # it prints its own lines (and tests run it in-process)
        configure_logging(logging.INFO)  # every log line JSON (serve sets its --log-level later)
    try:
        if args.command == "generate":
            from pegainfer.daemon.generate import run_generate
            return run_generate(args)
        if args.command == "expert-worker":
            from pegainfer.daemon.startup_check import check_device
            from pegainfer.engine.ep_setup import load_rank_experts
            from pegainfer.ep.preflight import preflight
            from pegainfer.ep.worker import end_process, run_expert_worker
            if not (args.model or args.random_preset):
                raise CliError("expert-worker needs --model DIR (or --random-preset)")
            preflight(args.backend, args.device, 1, remote_ranks=True)
            check_device(args.device)
            code = run_expert_worker(args.rank, args.world_size, args.master_addr, args.master_port,
                                     loader=load_rank_experts, model_dir=args.model, backend=args.backend,
                                     device=args.device, dtype=args.dtype, random_preset=args.random_preset,
                                     join_timeout_s=args.join_timeout, num_threads=args.num_threads)
            end_process(code)  # as the ranks rank 0 spawns end: no interpreter teardown
        if args.command == "serve":
            from pegainfer.daemon.serve import run_serve
            return run_serve(args)
        if args.command == "install-service":
            from pegainfer.daemon.install_service import run_install_service
            return run_install_service(args)
        raise CliError(f"unknown command {args.command}")
    except USAGE_ERRORS as e:
        print(f"pegainfer: error: {e}", file=sys.stderr)
        return 2
    except USER_ERRORS as e:
        print(f"pegainfer: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
