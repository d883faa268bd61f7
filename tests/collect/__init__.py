"""collect's tests, one module per room of ddpdeploy/collect/ (checkpoint, plain, debug,
source, destination, pod, volume) and the command (test_cli). A package, so its module names
stay its own beside the suite's (tests/test_cli.py is the whole CLI's)."""
