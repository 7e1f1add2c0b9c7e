"""flexcomm.client: inside the training process.

hook.py (the DDP comm hook: start here), sync.py (GradientSync, for loops without
DDP), decisions.py (the DecisionSource interface and PolicySource), agent_client.py
(a DecisionSource backed by the node's agent), compress.py (Top-k, error
feedback, gains), collectives.py (dense, AG-Topk, AR-Topk over ring and tree),
engine.py (one decision on one flat gradient), controller.py and agreement.py
(steps, rank agreement, reports), runner.py (what hook and sync share).
"""
