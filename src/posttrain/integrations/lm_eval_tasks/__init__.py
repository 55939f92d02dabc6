"""lm-eval task YAMLs shipped with posttrain (``posttrain_arithmetic``, ``posttrain_arithmetic_mc``,
``posttrain_instructions``, ``posttrain_ifbench``) and their dataset and scoring functions (``utils.py``,
``instructions_utils.py``, loaded by lm-eval through ``!function``). lm-eval finds them through
``posttrain.integrations.lm_eval.TASKS_DIR`` (docs/lm-eval.md)."""
