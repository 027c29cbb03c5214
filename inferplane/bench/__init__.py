"""Measure and size: the load generator (`inferplane bench`), capacity what-ifs on the
simulator's clock (`inferplane capacity`) and cost per million tokens.

Modules: `datasets` (what to send), `client` (one streamed request, vLLM's timing),
`metrics` (vLLM's metric definitions), `load` (arrival processes, runs, sweeps),
`scrape` (/metrics before and after), `target` (a fleet file brought up on the
simulator), `simclock` (the simulator core on a simulated clock), `capacity`, `cost`.
"""
