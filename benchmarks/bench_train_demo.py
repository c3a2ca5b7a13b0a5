"""The `demo` training recipe as a learning benchmark and a regression gate.

    python benchmarks/bench_train_demo.py [--min-validation-gain G] [--min-test-gain G]
                                          [--set key=value ...]

Runs `openforge train --recipe demo` (teacher demonstrations through the gateway -> SFT ->
GRPO with in-place weight updates -> validation and test evaluations), prints the GRPO
reward curve, the validation and test mean rewards at the SFT checkpoint and after the last
GRPO step, the test gain with its standard error, and the phase timings, and writes the plot.

With `--min-validation-gain G` / `--min-test-gain G` it exits 1 when that split's gain is
below G: `nox -s learn` (and so CI) runs it with the validation gate; docs/training.md
says how G was set from the measured spread and why the test split is not gated. It
asserts nothing about time (the timings depend on the machine and its load).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from openforge.config import build_config
from openforge.errors import OpenforgeError
from openforge.training.recipes import DemoRecipe, run_recipe

FIGURES = ("validation_reward_sft", "validation_reward_final", "validation_gain",
           "validation_gain_se", "test_reward_sft", "test_reward_final", "test_gain", "test_gain_se",
           "test_by_family", "elapsed_s", "timings_s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="recipe field override (repeatable)")
    parser.add_argument("--output-dir", default="runs/bench-train-demo")
    for split in ("validation", "test"):
        parser.add_argument(f"--min-{split}-gain", type=float, default=None, metavar="G",
                            help=f"exit 1 when the {split} split's reward gain is below G")
    args = parser.parse_args(argv)
    overrides = [f"output_dir={args.output_dir}", *args.overrides]
    try:
        recipe = build_config(DemoRecipe, None, overrides)
        for split in ("validation", "test"):
            if getattr(args, f"min_{split}_gain") is not None and split not in recipe.eval_splits:
                raise OpenforgeError(f"--min-{split}-gain: the {split} split is not in "
                                     f"eval_splits {recipe.eval_splits}")
        summary = run_recipe("demo", None, overrides)
    except OpenforgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # A split left out of `eval_splits` has no figures.
    print(json.dumps({k: summary[k] for k in FIGURES if k in summary}, indent=2))
    print(f"plot and metrics: {Path(args.output_dir).resolve()}")
    failed = False
    for split, floor in (("validation", args.min_validation_gain), ("test", args.min_test_gain)):
        if floor is None:
            continue
        gain, se = summary[f"{split}_gain"], summary[f"{split}_gain_se"]
        verdict = "ok" if gain >= floor else "REGRESSION"
        failed |= gain < floor
        print(f"{verdict}: {split} gain {gain:+.3f} (s.e. {se:.3f}); the gate is >= {floor:+.3f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
