"""bench/run-bench's modules, lowest first: common (helpers), workloads (the
modes and the benchmarks as a table of definitions), allocs (the allocators
compared), runners (how each run is made, interleaved; planted bugs; the cost
check), aggregate (the rows read back), charts, summary, sections and report
(report.md). A module imports only those before it."""
