"""collect: a run's checkpoint brought home, from a local run's folder, a compose volume or
a pod's volume, checked as it is copied.

- `checkpoint`: the entry (`collect`); choosing and verifying a ddpdeploy checkpoint;
- `plain`: any other script's files, each checked complete, with a SHA256SUMS;
- `debug`: the run's hang stacks, flight recorder dumps and NCCL logs (`--debug`);
- `source`: what collect reads from (`Source`, a local folder) and the verified reads;
- `destination`: `--to`, written atomically, locked, put back as it was on failure;
- `pod`, `volume`: the cluster's and a compose run's volumes as sources.
"""
