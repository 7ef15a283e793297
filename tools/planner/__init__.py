"""The planner: what a job needs per GPU (memory) and how long its step takes (step time), for
each data-parallel strategy, before it waits in a queue. One command, `ddpkit memory`
(also `-m ddpkit.tools.planner` as a module); `--dry-run` and `--step-time` are modes of it.

One concern per module, each importing only those listed before it:

    model      the job's model on the meta device (shapes, FSDP units, activations); PlanError
    memory     per-rank state and buffers of each strategy (ZeRO accounting), pure arithmetic
    dryrun     the real model parallelized over a fake process group, measured; plan_for_spec
    links      links (presets, fitted from commbench) and the fabric of nodes x GPUs
    predict    per strategy: the collectives of a step, their cost, what compute hides
    job        the job's FSDP units and the compute of one micro-batch
    recommend  every strategy's predicted step beside the memory plan, and the recommended one
    steptime   `ddpkit memory --step-time` and the table it prints
    cli        `ddpkit memory`: the flags, the memory table, the dry-run report
"""
