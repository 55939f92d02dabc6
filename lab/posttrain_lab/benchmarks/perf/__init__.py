"""Speed and memory benchmarks of the training core (`posttrain bench rl-step`, `posttrain bench losses`)."""
