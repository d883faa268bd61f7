"""The smoke room: run the job's nodes somewhere close (local processes, a compose project)
and tell the truth about the run.

- `backend`: the interface every run backend implements (`RunBackend`, `Line`, `Node`);
- `launch`: the job as a smoke run starts it (CPU, gloo, restarts, the chaos hold) and each
  local node's torchrun argv and env, through the launch contract;
- `compose`: the job as a docker-compose project (pure), and a `smoke --docker` run's plan;
- `local`, `composerun`: the two run backends (local torchrun agents; a compose project);
- `budget`: the CPU budget a run must fit on this host;
- `runner`: the one run loop, its verdict (torchrun's: every agent exits 0) and outcome;
- `workspace`: what a local run wrote into the workspace outside its checkpoint folder.

No rich or typer here: the command (`ddpdeploy.commands.smoke`) shows what the runner
reports through a `Report` (ddpdeploy.report).
"""
