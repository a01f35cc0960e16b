"""Converters: other tools' traces in, commprof's trace out, and back.

- :mod:`.kineto`            PyTorch-profiler (Kineto) JSON -> commprof trace
- :mod:`.horovod_timeline`  HOROVOD_TIMELINE phases -> ``phase`` events
- :mod:`.chrome`            commprof trace -> Perfetto / chrome://tracing JSON

They build on :mod:`commprof.trace` only (never on the recording side or the
analyzers)."""
