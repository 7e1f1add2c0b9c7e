"""flexcomm.client: inside the training process.

    job.py           the one-line form: flexcomm.register / flexcomm.GradientSync (the agent, else the MOO)
    hook.py          the DDP comm hook (start here); sync.py: GradientSync, for loops without DDP
    runner.py        what the two share: options checked, a controller and a gradient step
    controller.py    steps, the rank agreement (agreement.py), statistics and reports
    step.py          one bucket: compensate, compress, update memory, communicate
    compressors/     one compressor per family: dense, bf16, powersgd, topk
    memory.py        the error-feedback residual every lossy family shares
    collectives.py   the transports: ring (all_reduce, all_gather) and tree
    selection.py     Top-k selectors; gains.py: the gains of probed compressions
    stats.py         what a step measured; layout.py: a model's gradient layout
    device.py        host/GPU moves and event clocks that never wait; syncguard.py: catching host reads
    decisions.py     the DecisionSource interface; agent_client.py: the node's agent as one
    summary.py       what the job chose: the change lines, summary(), scalars for a writer
    checkpoint.py    every rank's hook state in a framework's one checkpoint
    integrations/    Lightning's callback and Accelerate's helper (each imports its framework)
"""
