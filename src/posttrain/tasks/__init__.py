"""Built-in verifiable tasks and a dataset loader.

`get_task(name, **params) -> Task`, `list_tasks()`, `register_task` (a `Registry`). Built in:
`arithmetic`, `countdown`, `jsonl`, `instructions` / `ifbench` (verifiable instruction following),
`word_problems` (also `.json`, and `.parquet` when pyarrow is installed).
A plug-in ``package.module:Name`` (a subclass of :class:`Task`) works wherever a task name does.
"""

from posttrain.tasks import arithmetic as _arithmetic  # noqa: F401  (registers the task)
from posttrain.tasks import countdown as _countdown  # noqa: F401
from posttrain.tasks import instructions as _instructions  # noqa: F401
from posttrain.tasks import jsonl as _jsonl  # noqa: F401
from posttrain.tasks import word_problems as _word_problems  # noqa: F401
from posttrain.tasks.arithmetic import ArithmeticTask
from posttrain.tasks.base import (
    DEFAULT_MARKER,
    SPLITS,
    TASKS,
    Example,
    SplitName,
    Task,
    get_task,
    list_tasks,
    register_task,
)
from posttrain.tasks.countdown import CountdownTask, ExpressionError, parse_expression
from posttrain.tasks.inputs import ExamplesTask, as_task
from posttrain.tasks.jsonl import DatasetError, DatasetWarning, JsonlTask, RowsTask, gsm8k_final, last_boxed
from posttrain.utils.registry import subclass_of

TASKS.accept(subclass_of(Task), "a subclass of posttrain.tasks.Task")

__all__ = [
    "DEFAULT_MARKER",
    "SPLITS",
    "TASKS",
    "ArithmeticTask",
    "CountdownTask",
    "DatasetError",
    "DatasetWarning",
    "Example",
    "ExamplesTask",
    "ExpressionError",
    "JsonlTask",
    "RowsTask",
    "SplitName",
    "Task",
    "as_task",
    "get_task",
    "gsm8k_final",
    "last_boxed",
    "list_tasks",
    "parse_expression",
    "register_task",
]
