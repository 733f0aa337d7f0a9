"""A tiny script for torchrun's ranks (not the trainer): what a failing or stuck rank does.

python -m torch.distributed.run --nproc_per_node=2 ... ranks.py leak      every rank prints HF_TOKEN in
    a line, in an environment dump and in the middle of a 3 MiB line (across the engine's 1 MiB cut),
    then raises an exception whose message holds it (torchrun's error file records it)
... ranks.py sleep PIDDIR                                                  every rank writes its pid to
    PIDDIR/rank<N>.pid and sleeps until killed
"""

import os
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record

CUT = 1 << 20  # the engine's line limit: the token straddles it


@record
def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    if sys.argv[1] == "sleep":
        path = os.path.join(sys.argv[2], f"rank{rank}.pid")
        with open(path + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        time.sleep(600)
        return
    token = os.environ["HF_TOKEN"]
    print(f"rank {rank} logging in with {token}", flush=True)
    print(f"environment: {dict(os.environ)}", flush=True)
    # torchrun --tee puts "[default0]:" (11 characters) before the line the engine reads.
    at = CUT - len(token) // 2 - len("[default0]:")
    print("x" * at + token + "y" * ((3 << 20) - at - len(token)), flush=True)
    raise RuntimeError(f"rank {rank}: the Hub refused token {token}")


if __name__ == "__main__":
    main()
