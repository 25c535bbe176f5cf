"""A stand-in for ``slipway train --worker`` that starts in milliseconds (no TensorFlow).

It honours the same contract as the trainer: reads ``TF_CONFIG`` and
``SLIPWAY_WORKER_INDEX``, rewrites ``SLIPWAY_HEARTBEAT_FILE`` after every step, resumes
from its saved state after a restart, and on SIGTERM saves at the next step boundary and
exits 143. Faults are injected by flags, on the first attempt only unless ``--always``:

    --crash-at K     exit with --exit-code instead of completing step K
    --hang-at K      stop (no more heartbeats, SIGTERM ignored) instead of completing step K
    --preempt-at K   exit 143 after saving, as if this worker alone had been preempted

Files in ``--state`` (per worker ``i``): ``state-i.json`` (steps done, attempts, pid),
``tf_config-i.jsonl`` (the TF_CONFIG of every attempt), ``sigterm-i`` (the step at which
SIGTERM was honoured).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from contracts.atomic_files import write_json_atomically
from training.launcher import HEARTBEAT_ENV, WORKER_INDEX_ENV, write_heartbeat
from training.preemption import EXIT_PREEMPTED

STALL_LIMIT_SECONDS = 60.0  # a stalled worker never outlives a broken test run by much


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--hang-at", type=int)
    parser.add_argument("--preempt-at", type=int)
    parser.add_argument("--only-worker", type=int, help="the one worker that misbehaves")
    parser.add_argument("--always", action="store_true", help="misbehave on every attempt")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    index = int(os.environ[WORKER_INDEX_ENV])
    heartbeat = Path(os.environ[HEARTBEAT_ENV])
    tf_config = json.loads(os.environ["TF_CONFIG"])
    if tf_config["task"] != {"type": "worker", "index": index}:
        print(f"TF_CONFIG task {tf_config['task']} is not worker {index}", flush=True)
        return 2
    with open(args.state / f"tf_config-{index}.jsonl", "a") as configs:
        configs.write(json.dumps(tf_config) + "\n")

    state_file = args.state / f"state-{index}.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"step": 0}
    state["attempts"] = state.get("attempts", 0) + 1
    state["pid"] = os.getpid()
    write_json_atomically(state_file, state)
    misbehaves = args.only_worker in (None, index) and (args.always or state["attempts"] == 1)

    terminated = False

    def on_sigterm(_signum: int, _frame: object) -> None:
        nonlocal terminated
        terminated = True

    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"worker {index} attempt {state['attempts']} from step {state['step']}", flush=True)
    while state["step"] < args.steps:
        if terminated:
            (args.state / f"sigterm-{index}").write_text(str(state["step"]))
            print(f"worker {index} saved at step {state['step']} after SIGTERM", flush=True)
            return EXIT_PREEMPTED
        step = state["step"] + 1
        if misbehaves and step == args.crash_at:
            print(f"worker {index} crashing at step {step}", flush=True)
            return args.exit_code
        if misbehaves and step == args.preempt_at:
            print(f"worker {index} preempted at step {step}", flush=True)
            return EXIT_PREEMPTED
        if misbehaves and step == args.hang_at:
            print(f"worker {index} stalling at step {step}", flush=True)
            time.sleep(STALL_LIMIT_SECONDS)  # SIGTERM only sets the flag; sleep resumes
            return 3
        time.sleep(args.step_time)
        state["step"] = step
        write_json_atomically(state_file, state)
        write_heartbeat(heartbeat, step)
        print(f"worker {index} step {step}/{args.steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
