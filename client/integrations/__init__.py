"""flexcomm in the training frameworks: `lightning.py` (a Lightning callback) and
`accelerate.py` (Accelerate). Each imports its framework; nothing else of
flexcomm imports them."""
