"""commprof analyzers (installed as ``commprof.analyzers``): pure functions,
trace events (Arrow / pandas) in, tables out. They import nothing of the
recording side and never plot; renderers (:mod:`commprof.render`) format.

One analyzer per module:
- :mod:`.events`      trace rows as numpy arrays (category codes from the schema)
- :mod:`.intervals`   the interval sweep everything else builds on
- :mod:`.breakdown`   per-rank, per-step time attribution (exposed / busy / overlap)
- :mod:`.throughput`  step time, steps/s, samples/s
- :mod:`.collectives` per-collective counts, latency, algbw / busbw, arrival skew
- :mod:`.stragglers`  persistently late ranks
- :mod:`.kernels`     GPU kernel classes and HTA's temporal breakdown
- :mod:`.timeline`    a few steps of a few ranks, for the HTML timeline
- :mod:`.bottleneck`  findings with evidence and advice
- :mod:`.scaling`     one run analysed in chunks; the per-GPU-count tables across runs
- :mod:`.diff`        what grew or shrank between two runs
- :mod:`.report`      the report pipeline: which tables, in which order, with which notes
"""
