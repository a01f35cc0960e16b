"""The recording side: everything that runs in (or launches) the recorded job.

- :mod:`.launcher`   ``commprof record``: runs the command, merges the shards
- :mod:`.bootstrap`  the ``sitecustomize`` start-up injection in each process
- :mod:`.importhook` installs instruments when their framework is imported
- :mod:`.config`     the one settings object (environment / file round trip)
- :mod:`.session`    one process's recording: recorder + instruments + exits
- :mod:`.recorder`   event emission and lifecycle, with :mod:`.steps` (the step
  clock), :mod:`.writer` (the journal writer thread), :mod:`.kernelmode`,
  :mod:`.device` (CUDA event timing), :mod:`.telemetry` (NVML), :mod:`.nvtx`
- :mod:`.ranks`      which rank this process is, from the launchers' variables
- :mod:`.instruments` one module per patched API, each reversible

The hot path (instruments -> recorder) imports no pyarrow, numpy or pandas.
"""
