"""A launcher for a deliberately altered serving path: real vLLM, the same flags, but weights moved
by seeded noise, as a wrong kernel or a broken quantization would move the numbers.

``perturbed_vllm.py --into DIR --noise F --model M ...``: the options before ``--model`` are its
own, the rest is what the plugin appends. It writes a copy of the model folder ``M`` into ``DIR``
whose every matrix has Gaussian noise of ``F`` times its own standard deviation added (seed 0),
then becomes vLLM's OpenAI server (``exec``: the same process, so the plugin's process tree is
vLLM's) serving the copy under the same served name. The config, and so its identity, stays the
same: what an altered vLLM looks like to the canary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def perturbed_copy(model: Path, into: Path, noise: float) -> Path:
    """``model``'s folder copied to ``into`` with its weights perturbed (written once)."""
    import torch  # vLLM's environment: safetensors of bfloat16 need torch
    from safetensors.torch import load_file, save_file

    target = into / f"{model.name}-noise{noise:g}"
    if target.exists():
        return target
    partial = into / f".{target.name}.partial"
    shutil.copytree(model, partial, dirs_exist_ok=True)
    weights = partial / "model.safetensors"
    tensors = load_file(weights)
    generator = torch.Generator().manual_seed(0)
    for name, tensor in tensors.items():
        if tensor.dim() == 2:
            values = tensor.float()
            moved = values + torch.randn(values.shape, generator=generator) * values.std() * noise
            tensors[name] = moved.to(tensor.dtype)
    save_file(tensors, weights, metadata={"format": "pt"})
    partial.rename(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--into", type=Path, required=True, help="folder for the perturbed copy")
    parser.add_argument("--noise", type=float, required=True, help="noise, in standard deviations of each matrix")
    own, rest = parser.parse_known_args()
    at = rest.index("--model") + 1
    own.into.mkdir(parents=True, exist_ok=True)
    rest[at] = str(perturbed_copy(Path(rest[at]), own.into, own.noise))
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *rest]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
