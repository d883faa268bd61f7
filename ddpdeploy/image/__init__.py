"""The training image, one room: `plan` (pure: what goes into the build context, the build
arguments, the content-derived tag), `context` (the workspace read into that context, a tar
that is hashed as it is written) and `build` (the flow behind `build`, `up --build` and
`smoke --docker`: build or reuse, tag, push). The engine itself is adapters/docker_engine."""
