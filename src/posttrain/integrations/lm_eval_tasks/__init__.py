"""lm-eval task YAMLs shipped with posttrain (``posttrain_arithmetic``, ``posttrain_arithmetic_mc``) and
their dataset and scoring functions (``utils.py``, loaded by lm-eval through ``!function``). lm-eval
finds them through ``posttrain.integrations.lm_eval.TASKS_DIR`` (docs/lm-eval.md)."""
