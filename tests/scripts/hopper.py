"""Rank 0 leaves a process with a cleared environment, in a session of its own, that
forks and exits over and over, so its pid keeps moving on. Argument: a tag (in its command
line, for the test to find it)."""

import os
import sys
import time

import torch.distributed as dist

tag = sys.argv[1]
dist.init_process_group("gloo")
if dist.get_rank() == 0 and os.fork() == 0:
    os.setsid()
    hop = "import os, time\nwhile True:\n    if os.fork():\n        os._exit(0)\n"
    hop += "    time.sleep(0.001)\n"
    os.execve(sys.executable, [sys.executable, "-c", hop, f"hop{tag}"], {})
time.sleep(1)
dist.barrier()
dist.destroy_process_group()
