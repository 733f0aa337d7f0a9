"""transformers.Trainer driver: a tiny regressor, trained by the Trainer as its users train.

    python -m probes.drivers.hf_trainer --output-dir OUT                             # uninterrupted, 20 steps
    SPECPROBE_STOP_AT_STEP=10 python -m probes.drivers.hf_trainer --output-dir OUT    # session 1 stops at 10
    python -m probes.drivers.hf_trainer --output-dir OUT --resume                    # session 2 resumes

Checkpoints go to ``OUT/checkpoint-N/`` every ``--save-steps`` steps and at the horizon. ``--mode``:

- ``default``: the stop comes from the probe's callback (``SPECPROBE_STOP_AT_STEP``); the resume is exact.
- ``broken_max_steps_stop``: the session is ended by ``max_steps=SPECPROBE_STOP_AT_STEP`` instead, so its LR
  schedule ends at the stop; the resumed session trains the step after it at LR 0.0, and the weights drift.
- ``broken_no_optimizer_state``: ``save_only_model=True``, so checkpoints lack optimizer.pt (and scheduler.pt and
  the RNG); the Trainer resumes silently with a fresh AdamW and a new warm-up.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from transformers import Trainer, TrainingArguments, set_seed

import probes.auto  # noqa: F401  (the one line: every Trainer below prints the probe's lines)
from probes.drivers.common import Regressor, Samples, quiet_cpu
from probes.emit import stop_at_step

MODES = ("default", "broken_max_steps_stop", "broken_no_optimizer_state")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m probes.drivers.hf_trainer", description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", required=True, help="the Trainer's output_dir (checkpoints go under it)")
    p.add_argument("--mode", choices=MODES, default="default")
    p.add_argument("--steps", type=int, default=20, help="the run's horizon (max_steps)")
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="resume from the last checkpoint-N in --output-dir")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    quiet_cpu()
    max_steps = args.steps
    if args.mode == "broken_max_steps_stop" and (stop := stop_at_step()) is not None:
        max_steps = stop  # the session's horizon becomes the stop, and with it the LR schedule's end
    targs = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=4,
        learning_rate=0.02,
        warmup_steps=3,
        lr_scheduler_type="linear",
        save_strategy="steps",
        save_steps=args.save_steps,
        save_only_model=args.mode == "broken_no_optimizer_state",
        logging_steps=args.save_steps,
        report_to="none",
        use_cpu=True,
        seed=args.seed,
        data_seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    set_seed(args.seed)  # the model's initial weights, before the Trainer seeds anything
    trainer = Trainer(model=Regressor(), args=targs, train_dataset=Samples())
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
