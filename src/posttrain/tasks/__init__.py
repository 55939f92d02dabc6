"""Built-in verifiable tasks and a dataset loader.

`get_task(name, **params) -> Task`, `list_tasks()`, `register_task` (a `Registry`). Built in:
`arithmetic`, `countdown`, `jsonl` (also reads `.parquet` when pyarrow is installed).
"""

from posttrain.tasks import arithmetic as _arithmetic  # noqa: F401  (registers the task)
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

__all__ = [
    "DEFAULT_MARKER",
    "SPLITS",
    "TASKS",
    "ArithmeticTask",
    "Example",
    "SplitName",
    "Task",
    "get_task",
    "list_tasks",
    "register_task",
]
