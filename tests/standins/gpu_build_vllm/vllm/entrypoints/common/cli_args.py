"""The serve flags the stand-in sessions give: the model, where to listen, and sleep mode."""

import argparse


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--model")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--served-model-name")
    parser.add_argument("--enable-sleep-mode", action="store_true")
    return parser
