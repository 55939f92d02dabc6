"""posttrain's lab: the method recipes, benchmarks, studies and demos built on the posttrain library.

* ``recipes/<method>`` — one folder per method (E3, DAPO, ASRR, NexGRPO, APARL, DuCA, PaTaRM): its code,
  configs and README. Its names (samplers, shapers, replay buffers, advantages, tasks, rewards,
  environments, reward sources) reach the library's registries through this package's entry points.
* ``benchmarks`` — SILO-BENCH, the perf benchmarks (`posttrain bench ...`) and the objectives ablation.
* ``studies`` — continual instruction tuning (KPIG), instruction-tuning analyses, SCPG.
* ``demos`` — `posttrain demo` (tiny model) and `posttrain demo smol` (the real model).
* ``cli`` — the lab's commands, added to `posttrain` through the ``posttrain.cli`` entry point.
"""

__version__ = "0.2.0"
