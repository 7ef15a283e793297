"""The training loop, in small modules imported downward only:
- schedule.py: the learning-rate rules (pure functions);
- runlock.py: one job per checkpoint dir (the `.lock` file and its heartbeat);
- rundir.py: the dirs a run claims before it writes anything;
- evaluate.py: the held-out evaluation;
- ending.py: how a run ends (finished, stopped by a signal, diverged), its base class RunEnd;
- logstep.py: the logging steps (the loss all-reduce, the line and record), base class LogSteps;
- trainer.py: Trainer, state up front, `train()` short, one step in `train_step`.
"""

from ddpkit.train.loop.trainer import CollectiveFailure, Trainer

__all__ = ["CollectiveFailure", "Trainer"]
