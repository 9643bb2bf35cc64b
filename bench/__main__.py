"""`python -m bench NAME [args]`: run one benchmark (`predictor`)."""

from __future__ import annotations

import sys

from bench import (
    batch,
    before,
    cache,
    capacity,
    door,
    instructions,
    jobs,
    mesh,
    pipelines,
    predictions,
    predictor,
    readiness,
    reload,
    shadow,
    shedding,
    swapin,
    traces,
)

BENCHMARKS = {
    "predictor": predictor.main,
    "proxy": mesh.proxy_main,
    "pipelines": pipelines.main,
    "door": door.main,
    "preprocess": mesh.preprocess_main,
    "capacity": capacity.main,
    "foreign": swapin.main,
    "readiness": readiness.main,
    "reload": reload.main,
    "shedding": shedding.main,
    "shadow": shadow.main,
    "predictions": predictions.main,
    "cache": cache.main,
    "jobs": jobs.main,
    "batch": batch.main,
    "traces": traces.main,
    "instructions": instructions.main,
    "before": before.main,
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        print(f"usage: python -m bench {{{','.join(BENCHMARKS)}}} [args]", file=sys.stderr)
        return 2
    return BENCHMARKS[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
