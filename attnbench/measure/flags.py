"""The limits past which a measured row is flagged, read by the code that measures and flags
it (timing.py, profiling.py) and by the report that explains the flags. Declared here, apart
from those modules, because they import torch at the top (their functions run in the timed
loop and the profiler) and the report, compare and fidelity read rows without torch."""

# a row whose p20-p80 spread is more than this fraction of its median is flagged as noisy: its
# median can move between identical runs by more than most changes one wants to see
NOISY_SPREAD = 0.10
# a CPU row with at least this many minor page faults (4 KiB pages) per timed call is flagged:
# its calls page memory back in (the allocator handed it to the OS), which makes time_ms
# unstable; a few faults per call are the timer's own bookkeeping
PAGE_FAULTS_FLAG = 10.0
MISMATCH_PCT = 5.0  # harness median vs profiler kernel time: flagged beyond this
# without --profile, a CUDA row's median is cross-checked against the profiler on the first
# row of each impl and every CROSS_CHECK_EVERY-th after it: a profiler session (CUPTI set-up,
# three calls, the event tree) costs about a second per row, most of a small row's cost
CROSS_CHECK_EVERY = 10
