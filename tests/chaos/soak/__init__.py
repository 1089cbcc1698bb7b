"""Chaos soak: replicas against one simulated cluster under random faults, checked against the truth.

Run it long: ``.venv/bin/python -m tests.chaos.soak --minutes 10 [--json report.json] [--plot DIR]``
(prints a progress line a minute and a final table; exit status 1 on any failed check); the CI version is
``tests/chaos/test_soak.py`` (100 s of faults).

What happens:

* in this process: a ``SimulatedCluster`` and a ``WorkloadGenerator`` that keeps a bounded population
  (``max_jobs``) and runs TrainJob lifecycles (create, suspend/admit, run, finish, duplicate terminal
  writes, delete) at ``rate`` steps per second, with an independent ground truth of what the metrics should
  say; a real Prometheus scraping every replica slot each second; the fault injection and the checks;
* the replicas (leader election on), each served on its own slot, a socket bound before any replica starts
  and held for the whole run (tests/support/slots.py): by default (``processes``, the command line) four,
  each a process of its own running the service as the CLI does (tests/support/replica_process.py), two of
  them *residents* that are never killed or restarted, whose memory is followed for the whole run
  (tests/chaos/memory.py); with ``--in-process`` three ``Service`` objects on this process's event loop;
* every few seconds one fault episode, in shuffled rounds so that every kind occurs: stalled watch streams
  (no bytes, no close; longer than the inactivity timeout), resets mid-chunk (open streams and the next
  ones), 410 Expired by compaction, 429 with Retry-After, 500/503/504, a full API-server restart that
  loses watch history, a leader killed without release (SIGKILL, or ``Service.kill()`` in this process; a
  fresh replica with a new identity replaces it once a survivor has taken over), a graceful leader restart
  (SIGTERM: hand over, release, exit; then start). A leader fault that finds a resident leading first
  demotes it: every Lease update fails until it has stepped down and the Lease has expired (the "leader
  cannot renew" hand-over), until another replica leads;
* at the end the generator stops, the faults are cleared and everything settles; then the report says
  what the leaders counted over all their terms against the truth, what PromQL saw against the truth and
  against what each replica counted, the final leader's gauge against the true current state, whether
  anything crashed or logged an error, readiness during stalls, and each service process's memory.

What each replica does is recorded by its tap (tests/chaos/tap.py), wherever it runs: its leader terms
(start with the floor, stop), every count it made, the relists of its TrainJob informer. A term's counts are
the sum of its ``count`` records. The documented bound (docs/leadership.md): a graceful hand-over is exact;
after a kill (or a lost Lease), the events the old leader counted above the watermark it had last published
may be counted again by the next leader, nothing is lost. For every term that ends, the events it counted
above the Lease's published watermark are kept; the next term's floor (the watermark it starts from) says
which of them may be counted again: that is the per-series allowance. The second documented bound: an edge
that the new leader's relist found on a newer state of the job, above its floor while the edge itself was at
or below it; ``DoubleCounts`` catches every edge counted twice as it happens, names its cause, and adds
these (verified against that replica's relists) to the allowance.
"""
