"""Training workflows: the RL loop (`rl.py`), SFT warm starts (`sft.py`), checkpoints, evaluation."""
