"""python -m trainer.preflight [--gpus N] [--need-token] [--repo URL]: does this machine meet the real
target's requirements, before a long session is spent finding out?

Checks, each reported on its own line when it fails:
  (always)        the trainer's dependencies are installed (a core-only `pip install .` lacks them)
  --gpus N        CUDA is available and at least N GPUs are visible (N=0 skips the GPU checks)
  --need-token    a Hugging Face token is available: HF_TOKEN, or the token `hf auth login` saved (what
                  huggingface_hub.get_token() finds; never printed, only whether and where it was found)
  --repo URL      a store URL that parses; a Hub URL (hf://owner/name or owner/name) also needs a token

Exit codes: 0 every requirement met (one summary line on stdout); 3 at least one missing (one line per
missing requirement on stderr, each starting with "preflight: "); 2 bad command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Mapping, Sequence

from trainer.deps import EXIT_MISSING, missing_dependencies, missing_message

EXIT_OK, EXIT_USAGE = 0, 2


def _cuda_probe() -> tuple[bool, int, list[str]]:
    """(available, device count, device names) from the installed torch."""
    import torch

    if not torch.cuda.is_available():
        return False, 0, []
    n = torch.cuda.device_count()
    return True, n, [torch.cuda.get_device_name(i) for i in range(n)]


def _login_token() -> str | None:
    """The token huggingface_hub would use: HF_TOKEN, else the one `hf auth login` saved (or Colab's secret)."""
    from huggingface_hub import get_token

    return get_token()


def check(
    *,
    gpus: int,
    need_token: bool,
    repo: str | None,
    environ: Mapping[str, str],
    cuda: Callable[[], tuple[bool, int, list[str]]] = _cuda_probe,
    login_token: Callable[[], str | None] = _login_token,
    missing: Callable[[], list[str]] = missing_dependencies,
) -> tuple[list[str], str]:
    """Returns (problems, summary). Pure apart from `cuda()`, `login_token()` and `missing()` (the trainer's
    dependencies not installed); the token's value is never used in output. A token counts from ``environ``'s
    HF_TOKEN or, failing that, from ``login_token()``. The GPU and saved-token probes need torch and
    huggingface_hub: without them, the missing dependencies are the problem said."""
    absent = missing()
    problems: list[str] = [missing_message("this run", absent)] if absent else []
    parts: list[str] = []
    if gpus > 0 and "torch" not in absent:
        available, n, names = cuda()
        if not available:
            problems.append(f"CUDA is not available (torch sees no GPU), {gpus} GPU(s) required")
        elif n < gpus:
            problems.append(f"{n} GPU(s) visible, {gpus} required ({', '.join(names) or 'none'})")
        else:
            parts.append(f"gpus={n} ({', '.join(sorted(set(names)))})")
    # Without huggingface_hub no saved token can be read: HF_TOKEN alone counts.
    token_from = None
    if environ.get("HF_TOKEN", "").strip():
        token_from = "HF_TOKEN=set"
    elif "huggingface_hub" not in absent and (login_token() or "").strip():
        token_from = "token=saved (hf auth login)"
    hub_repo = False
    if repo is not None:
        from trainer.store import parse_store_url, redact_url

        try:
            url = parse_store_url(repo)
        except ValueError as e:
            problems.append(f"--repo {redact_url(repo)}: {e}")
        else:
            hub_repo = url.kind == "hf"
            parts.append(f"repo={redact_url(repo)} ({'hub' if hub_repo else 'local'})")
    if (need_token or hub_repo) and token_from is None:
        why = "--need-token" if need_token else f"--repo {redact_repo(repo)} is a Hub repo"
        problems.append(
            f"no Hugging Face token: HF_TOKEN is not set in the environment and `hf auth login` saved none ({why})"
        )
    elif need_token or hub_repo:
        parts.append(token_from)
    return problems, "preflight ok: " + (" ".join(parts) if parts else "nothing required")


def redact_repo(repo: str | None) -> str:
    from trainer.store import redact_url

    return redact_url(repo or "")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.preflight", description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=0, help="GPUs required (0: no GPU check)")
    p.add_argument(
        "--need-token", action="store_true", help="a Hugging Face token must be available (HF_TOKEN or `hf auth login`)"
    )
    p.add_argument("--repo", help="checkpoint store URL the run will use")
    a = p.parse_args(argv)
    if a.gpus < 0:
        p.error(f"--gpus must not be negative, got {a.gpus}")
    problems, summary = check(gpus=a.gpus, need_token=a.need_token, repo=a.repo, environ=os.environ)
    for line in problems:
        print(f"preflight: {line}", file=sys.stderr, flush=True)
    if problems:
        return EXIT_MISSING
    print(summary, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
