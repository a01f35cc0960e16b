"""commprof analyzers: pure functions, events (pandas / Arrow) in, tables out.

One analyzer per module:
- :mod:`analyzers.breakdown`   per-rank, per-step time attribution
- :mod:`analyzers.throughput`  step time, steps/s, samples/s
- :mod:`analyzers.collectives` per-collective counts, latency, algbw/busbw
- :mod:`analyzers.scaling`     the per-GPU-count table across runs
Renderers (terminal, md, csv, json) live in :mod:`analyzers.renderers` and
never compute.
"""
