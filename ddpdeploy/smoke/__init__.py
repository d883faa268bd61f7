"""The smoke room: run the job's nodes somewhere close (local processes, a compose project)
and tell the truth about the run.

- `target`: the interface every smoke target implements (`SmokeTarget`, `Line`, `Node`);
- `events`: the pure reader of torchrun's console (rank prefixes, the optional event
  protocol, torchrun's failure summary and the root cause);
- `budget`: the CPU budget a run must fit on this host;
- `plan`: the run plan, what each node's torchrun agent gets (argv, env, run-only env);
- `runner`: the one run loop, its verdict (torchrun's: every agent exits 0) and outcome;
- `docker`: the compose project a `smoke --docker` run starts.

No rich or typer here: the command (`ddpdeploy.commands.smoke`) shows what the runner
reports through a `View`.
"""
