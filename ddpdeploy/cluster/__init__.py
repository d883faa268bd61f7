"""The cluster room: what the cluster verbs decide and do, with no printing.

- ``apply``: up, scale, resume and down through one apply/delete path (ownership check,
  preflight, server-side dry run, take-back);
- ``find``: the one "find our job" preamble (connect, namespace, the job, the "no job" line);
- ``labels``: our labels and the one label-selector builder;
- ``jobstate``: a job's state from its conditions and pods (pure);
- ``saved``: the spec and run record a job carries, the scaled spec (pure);
- ``capacity``: what the nodes can hold, for the preflight (pure);
- ``watch``: snapshots, the wait loop, rank 0's pod, the logs to follow;
- ``podlogs``: every pod's log merged by rank and node, rank 0's progress.

What is shown (tables, live views, lines) is the commands' (ddpdeploy.commands.views); this
room hands them values and calls the ``say``/``show`` callbacks they pass.
"""
