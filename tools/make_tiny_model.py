"""Command line for writing a synthetic DeepSeek-V2-family checkpoint (engine/checkpoint_writer.py):

    python tools/make_tiny_model.py --out DIR [--preset tiny|lite] [--seed N] [--config-overrides JSON]
                                    [--no-chat-template]

The checkpoint's tokenizer_config.json carries DeepSeek-V2-Chat's chat template, so that
/v1/chat/completions runs on it; --no-chat-template writes it without one (a base model's).

Prints the folder on success. Bad input (invalid JSON, an override that makes an invalid config, an
existing non-empty DIR) prints one line on stderr and exits 2."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.benchkit import cli  # noqa: E402

PROG = "make_tiny_model"


def fail(message: str) -> NoReturn:
    cli.fail(PROG, message)


def main(argv: list[str] | None = None) -> int:
    parser = cli.Parser(prog=PROG, description="Write a random-weight DeepSeek-V2-family checkpoint folder.")
    parser.add_argument("--out", required=True, type=Path, help="folder to create (must not exist, or be empty)")
    parser.add_argument("--preset", default="tiny", choices=("tiny", "lite"), help="tiny (CPU tests) or lite (the real shapes, ~31 GB)")
    parser.add_argument("--seed", default=0, type=int, help="weights seed (default 0)")
    parser.add_argument("--config-overrides", default=None, metavar="JSON",
                        help='JSON object of config.json fields to replace, e.g. \'{"q_lora_rank": 16}\'')
    parser.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                        help="write tokenizer_config.json without a chat template (the server then refuses chat)")
    args = parser.parse_args(argv)
    overrides = None
    if args.config_overrides is not None:
        try:
            overrides = json.loads(args.config_overrides)
        except json.JSONDecodeError as e:
            fail(f"--config-overrides is not valid JSON: {e}")
        if not isinstance(overrides, dict):
            fail(f"--config-overrides must be a JSON object, got {type(overrides).__name__}")

    from pegainfer.engine.checkpoint_writer import write_checkpoint  # after argument checks: imports torch
    from pegainfer.engine.config import ConfigError

    try:
        path = write_checkpoint(args.out, args.preset, args.seed, overrides, chat_template=args.chat_template)
    except (ConfigError, FileExistsError) as e:
        fail(str(e))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
