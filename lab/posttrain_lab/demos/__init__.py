"""The demos behind `posttrain demo` (``tiny``: the tiny model's SFT + RL) and `posttrain demo smol`
(the real model, ``smol``)."""
