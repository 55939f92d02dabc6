"""Benchmarks behind `posttrain bench ...`. Shared timing / peak-memory helpers live in
`posttrain.benchmarks.perf.common` (`PeakMemory`, `time_fn`, `summarize_times`, `run_isolated`)."""
