"""Rank 0 leaves two processes that carry no smoke marker: `env -i sleep` started through
subprocess, and one that left its session through setsid and a double fork. Arguments: a
tag (in their command lines, for the test to find them) and seconds to wait before the end."""

import os
import subprocess
import sys
import time

import torch.distributed as dist

tag, wait = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    subprocess.Popen(["env", "-i", "sleep", f"999{tag}1"])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("env", ["env", "-i", "sleep", f"999{tag}2"])
        os._exit(0)
    print("escaped", flush=True)
time.sleep(wait)
dist.barrier()
dist.destroy_process_group()
