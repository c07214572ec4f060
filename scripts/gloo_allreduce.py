#!/usr/bin/env python3
"""torch.distributed gloo all_reduce on loopback: the peer figure for `loco bench allreduce`.

Starts WORLD processes on 127.0.0.1, each with ELEMENTS float32 values, does a small warm-up
all_reduce, then times REPEAT all_reduces of the same inputs, each after a barrier (SUM, then
divide: the same average loco computes), and prints one JSON line: the best repetition's
slowest rank ("seconds"), every repetition's, and the CPU time per rank, as `loco bench allreduce
--repeat` does.

Usage: gloo_allreduce.py [--world 4] [--elements 25000000] [--repeat 1]

Single-rank mode, one process per host or network namespace (scripts/bench-allreduce-wan.sh):
gloo_allreduce.py --rank R --master ADDR:PORT [--world 4] [--elements N] [--repeat K]
[--ifname DEV] runs rank R only; rank 0 hosts the rendezvous on ADDR:PORT (its own address).
It prints one JSON line with this rank's seconds and CPU seconds of each repetition; whoever
started the ranks takes each repetition's slowest rank. --ifname sets GLOO_SOCKET_IFNAME, the
interface gloo's connections use (without it gloo uses the address the host name resolves to).
"""
import argparse
import datetime
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_allreduces(rank: int, world: int, elements: int, repeat: int):
    """A warm-up, then REPEAT timed all-reduces: (seconds, CPU seconds) of each."""
    g = torch.Generator().manual_seed(rank)
    inputs = torch.randn(elements, generator=g) * 10
    x = inputs.clone()
    warm = torch.ones(world * 16)
    dist.all_reduce(warm)
    seconds, cpu = [], []
    for _ in range(repeat):
        x.copy_(inputs)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        dist.all_reduce(x)
        x /= world
        seconds.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return seconds, cpu


def rank_main(rank: int, world: int, elements: int, repeat: int, port: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    seconds, cpu = timed_allreduces(rank, world, elements, repeat)
    out.put((rank, seconds, cpu))
    dist.destroy_process_group()


def single_rank(a) -> None:
    """One rank of a run whose ranks were started apart (--rank, --master)."""
    if not 0 <= a.rank < a.world:
        raise SystemExit(f"--rank {a.rank} out of range for --world {a.world}")
    if a.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = a.ifname
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{a.master}",
        rank=a.rank,
        world_size=a.world,
        timeout=datetime.timedelta(seconds=a.timeout),
    )
    seconds, cpu = timed_allreduces(a.rank, a.world, a.elements, max(1, a.repeat))
    # Every rank done before any leaves (rank 0 hosts the rendezvous).
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({
        "backend": "gloo",
        "codec": "fp32",
        "rank": a.rank,
        "world": a.world,
        "elements": a.elements,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "torch": torch.__version__,
    }), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--elements", type=int, default=25_000_000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--rank", type=int, help="single-rank mode: this process's rank")
    p.add_argument("--master", metavar="ADDR:PORT", help="single-rank mode: rank 0's rendezvous")
    p.add_argument("--ifname", help="single-rank mode: GLOO_SOCKET_IFNAME")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="single-rank mode: seconds to wait for the other ranks")
    a = p.parse_args()
    if (a.rank is None) != (a.master is None):
        p.error("--rank and --master go together")
    if a.rank is not None:
        single_rank(a)
        return
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=rank_main, args=(r, a.world, a.elements, max(1, a.repeat), port, out))
        for r in range(a.world)
    ]
    for pr in procs:
        pr.start()
    times = [out.get(timeout=600) for _ in procs]
    for pr in procs:
        pr.join(timeout=60)
    # A repetition takes as long as its slowest rank.
    n = max(1, a.repeat)
    reps = [max(t[i] for _, t, _ in times) for i in range(n)]
    # CPU time of one rank's all-reduce (all its threads): the median over repetitions of the
    # mean over ranks, as loco's bench reports it.
    cpu = sorted(sum(c[i] for _, _, c in times) / len(times) for i in range(n))
    print(json.dumps({
        "backend": "gloo",
        "codec": "fp32",
        "world": a.world,
        "elements": a.elements,
        "seconds": min(reps),
        "repetitions": reps,
        "cpu_seconds_per_rank": cpu[len(cpu) // 2],
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
