"""Benchmarks behind `posttrain bench ...`. Shared timing / peak-memory helpers live in
`posttrain_lab.benchmarks.perf.common` (`PeakMemory`, `time_fn`, `summarize_times`, `run_isolated`)."""
