# Child for tests/test_kill.py: the seed README's checkpoint/@resumable sample, verbatim except that
# the "# ... do the actual work ..." line appends the step to steps.log (fsync) and sleeps SEED_STEP_DELAY s.
from caravanserai import checkpoint, resumable


@resumable
def do_the_task(run_id, state):
    step = state.get("step", 0)
    while step < 5:
        step += 1
        with open("steps.log", "a") as log: log.write(f"{step}\n"); log.flush(); __import__("os").fsync(log.fileno()); __import__("time").sleep(float(__import__("os").environ.get("SEED_STEP_DELAY", "0.1")))
        checkpoint(run_id, {"step": step}, f"finished step {step}, next is step {step+1}")

do_the_task("my-run", {"step": 0})
