#!/usr/bin/env bash
# loco's ring all-reduce against torch.distributed gloo with every rank in its own Linux network
# namespace, joined through a bridge by links shaped to RATE Mbit/s in each direction.
#   usage: scripts/bench-allreduce-wan.sh [RATE_MBIT] [ELEMENTS] [REPEAT] [ROUNDS]
# Default: 1000 Mbit/s, 25M float32 values (100 MB) per rank, 5 timed all-reduces of the same
# inputs in each implementation's processes (after a warm-up, each after a barrier), 2 rounds in
# which the implementations take turns (gloo fp32, loco fp32, loco uint8, loco int8-block, gloo,
# ...); the table pools every round's repetitions. A repetition takes as long as its slowest rank.
# Needs root and iproute2 (`ip`, `tc`); exits 2 without them.
#
# The network: namespace lcw<pid>s holds a Linux bridge; namespace lcw<pid>r<k> holds rank k,
# whose veth0 (198.18.0.<k+2>/24, from the benchmarking range 198.18.0.0/15, and no other
# address: IPv6 is off) is paired with port r<k> of the bridge. Nothing is linked to the root
# namespace and there is no default route. Each rank's upload (veth0's egress) and download
# (r<k>'s egress) goes through a token bucket (tbf) at RATE; veth hands the qdisc GSO packets of
# up to 64 KB, so the bucket holds 2 ms at RATE and at least 256 KiB. The qdisc counts Ethernet
# frames without preamble and FCS, so one TCP flow's payload can reach 1448/1514 = 95.6% of RATE
# at most. A single-flow test (rank 0 to rank 1, through both buckets) measures what the shaping
# gives before the benchmark. No latency is added (this kernel has no netem).
#
# Goodput is the bytes one rank sends in one all-reduce (loco: the largest bytes_sent_per_rank of
# its ranks, frame bodies; gloo: the ring formula 2(W-1)/W x 4N) over the all-reduce's time,
# against the per-rank link rate RATE.
#
# It builds loco (release, no libtorch needed) unless LOCO_BIN names a loco binary to run, and
# takes PyTorch from scripts/torch-env.sh. LOCO_WAN_WORLD (default 4) sets the rank count,
# LOCO_WAN_RANK_TIMEOUT (default 600) the seconds any one rank process may run. Every namespace
# it makes is deleted when it exits, however it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE="${1:-1000}"; ELEMENTS="${2:-25000000}"; REPEAT="${3:-5}"; ROUNDS="${4:-2}"
WORLD="${LOCO_WAN_WORLD:-4}"; RANK_TIMEOUT="${LOCO_WAN_RANK_TIMEOUT:-600}"
for v in "$RATE" "$ELEMENTS" "$REPEAT" "$ROUNDS" "$WORLD" "$RANK_TIMEOUT"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || {
    echo "usage: $0 [RATE_MBIT] [ELEMENTS] [REPEAT] [ROUNDS] (positive integers; got '$v')" >&2
    exit 2
  }
done
if ((WORLD < 2 || WORLD > 200)); then
  echo "$0: LOCO_WAN_WORLD must be 2 to 200 (got $WORLD)" >&2; exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: needs root: it makes network namespaces, veth pairs and tc qdiscs" >&2; exit 2
fi
for tool in ip tc timeout; do
  command -v "$tool" >/dev/null || {
    echo "$0: needs '$tool' (iproute2 for ip and tc, coreutils for timeout)" >&2; exit 2
  }
done

# shellcheck source=scripts/torch-env.sh
source scripts/torch-env.sh
if [ -n "${LOCO_BIN:-}" ]; then
  LOCO="$LOCO_BIN"
else
  cargo build --release --quiet
  LOCO="${CARGO_TARGET_DIR:-target}/release/loco"
fi
SEGMENT=$("$LOCO" bench allreduce --help | awk '/--segment/ { s = 1 } s && /default:/ { gsub(/[^0-9]/, ""); print; exit }')
SEGMENT="${SEGMENT:-1048576}"

P="lcw$$"
SW="${P}s"
ns_of() { echo "${P}r$1"; }
addr_of() { echo "198.18.0.$(($1 + 2))"; }
TMP=$(mktemp -d)
made=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local ns pid
  # Processes still in our namespaces are rank processes this script started.
  for ns in "${made[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
  done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkns() {
  ip netns add "$1" || { echo "$0: cannot make network namespace $1" >&2; exit 2; }
  made+=("$1")
  ip -n "$1" link set lo up
  # No IPv6 (not even link-local addresses) on the links made in it.
  if [ -e /proc/sys/net/ipv6/conf/default/disable_ipv6 ]; then
    ip netns exec "$1" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6;
      echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6'
  fi
}
# Bucket: 2 ms at RATE, at least 256 KiB (GSO packets of 64 KB must fit); queue: 10 ms.
BURST=$((RATE * 250 > 262144 ? RATE * 250 : 262144))
shape() { # namespace device
  tc -n "$1" qdisc add dev "$2" root tbf rate "${RATE}mbit" burst "$BURST" latency 10ms
}
mkns "$SW"
ip -n "$SW" link add br0 type bridge stp_state 0 forward_delay 0
ip -n "$SW" link set br0 up
for ((k = 0; k < WORLD; k++)); do
  ns=$(ns_of "$k")
  mkns "$ns"
  ip link add veth0 netns "$ns" type veth peer name "r$k" netns "$SW"
  ip -n "$ns" addr add "$(addr_of "$k")/24" dev veth0
  ip -n "$ns" link set veth0 up
  ip -n "$SW" link set "r$k" master br0
  ip -n "$SW" link set "r$k" up
  shape "$ns" veth0
  shape "$SW" "r$k"
done

# Sum of a counter ("Sent N bytes" or "dropped N") over the qdiscs of every link.
qdisc_sum() { # bytes|dropped [rank]
  local ks k out=""
  if [ -n "${2:-}" ]; then ks=("$2"); else ks=($(seq 0 $((WORLD - 1)))); fi
  for k in "${ks[@]}"; do
    out+=$(tc -s -n "$(ns_of "$k")" qdisc show dev veth0)$'\n'
    [ -n "${2:-}" ] || out+=$(tc -s -n "$SW" qdisc show dev "r$k")$'\n'
  done
  if [ "$1" = bytes ]; then
    grep -o 'Sent [0-9]* bytes' <<<"$out" | awk '{ s += $2 } END { printf "%.0f\n", s }'
  else
    grep -o 'dropped [0-9]*' <<<"$out" | awk '{ s += $2 } END { printf "%.0f\n", s }'
  fi
}

# One TCP flow from rank 0 to rank 1 for about 2 s: what the shaping gives.
FLOW_PY='
import json, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1); s.settimeout(60)
    c, _ = s.accept(); c.settimeout(60)
    buf = bytearray(1 << 20); n = 0; t0 = None
    while True:
        k = c.recv_into(buf)
        if not k: break
        if t0 is None: t0 = time.perf_counter()
        n += k
    print(json.dumps({"bytes": n, "seconds": time.perf_counter() - t0}))
else:
    for _ in range(100):
        try:
            c = socket.create_connection((host, port), timeout=60); break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("no connection")
    b = bytes(1 << 20)
    for _ in range(int(sys.argv[4])): c.sendall(b)
    c.close()
'
FLOW_MB=$((RATE / 4 > 16 ? RATE / 4 : 16))  # about 2 s at RATE
echo "single-flow test: rank 0 to rank 1, $FLOW_MB MiB at ${RATE} Mbit/s shaping" >&2
ip netns exec "$(ns_of 1)" timeout 120 "$LOCO_PYTHON" -c "$FLOW_PY" recv "$(addr_of 1)" 5001 \
  >"$TMP/flow.json" &
recv_pid=$!
sent0=$(qdisc_sum bytes 0)
ip netns exec "$(ns_of 0)" timeout 120 "$LOCO_PYTHON" -c "$FLOW_PY" send "$(addr_of 1)" 5001 \
  "$FLOW_MB" || { echo "$0: the single-flow test's sender failed" >&2; exit 1; }
wait "$recv_pid" || { echo "$0: the single-flow test's receiver failed" >&2; exit 1; }
sent1=$(qdisc_sum bytes 0)
FLOW=$(python3 -c 'import json, sys; f = json.load(open(sys.argv[1])); f["qdisc_bytes"] = int(sys.argv[2]); print(json.dumps(f))' \
  "$TMP/flow.json" "$((sent1 - sent0))")

# One run: every rank of one implementation, each in its namespace; its JSON lines kept.
run_once() { # kind (gloo | a loco codec) index
  local kind=$1 i=$2 k ns rc pids=() failed=0 addrs=""
  for ((k = 0; k < WORLD; k++)); do addrs+="${addrs:+,}$(addr_of "$k"):$((20000 + i))"; done
  local d0 b0; d0=$(qdisc_sum dropped); b0=$(qdisc_sum bytes)
  for ((k = 0; k < WORLD; k++)); do
    ns=$(ns_of "$k")
    if [ "$kind" = gloo ]; then
      cmd=("$LOCO_PYTHON" scripts/gloo_allreduce.py --rank "$k" --world "$WORLD"
        --master "$(addr_of 0):$((30000 + i))" --ifname veth0 --elements "$ELEMENTS"
        --repeat "$REPEAT" --timeout 120)
    else
      cmd=("$LOCO" bench allreduce-rank --rank "$k" --addrs "$addrs" --elements "$ELEMENTS"
        --codec "$kind" --segment "$SEGMENT" --streams 1 --repeat "$REPEAT" --seed 0)
    fi
    ip netns exec "$ns" timeout "$RANK_TIMEOUT" "${cmd[@]}" >"$TMP/run$i.rank$k.json" \
      2>"$TMP/run$i.rank$k.err" &
    pids+=($!)
  done
  # As the ranks end (polled; `timeout` bounds each); once one fails, the others of this run are
  # stopped (their `timeout` passes the signal on).
  local left=$WORLD p done=()
  while ((left > 0)); do
    for ((k = 0; k < WORLD; k++)); do
      p=${pids[k]}
      [ -z "${done[k]:-}" ] && ! kill -0 "$p" 2>/dev/null || continue
      done[k]=1; left=$((left - 1))
      rc=0; wait "$p" || rc=$?
      if ((rc != 0)); then
        echo "$kind rank $k failed (exit $rc$( ((rc == 124)) && echo ", timed out after ${RANK_TIMEOUT} s")):" >&2
        tail -n 5 "$TMP/run$i.rank$k.err" >&2
        ((failed == 1)) || for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
        failed=1
      fi
    done
    ((left == 0)) || sleep 0.1
  done
  ((failed == 0)) || exit 1
  echo "$kind $(($(qdisc_sum dropped) - d0)) $(($(qdisc_sum bytes) - b0))" >"$TMP/run$i.meta"
}

# How busy the machine is without the benchmark (a shared machine's other work takes cores from
# the ranks): the share of all cores busy over 2 s.
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6; exit }' /proc/stat; }
read -r busy0 idle0 < <(cpu_ticks); sleep 2; read -r busy1 idle1 < <(cpu_ticks)
BACKGROUND=$(((busy1 - busy0) * 100 / (busy1 - busy0 + idle1 - idle0 + 1)))

KINDS=(gloo fp32 uint8 int8-block)
i=0
for ((round = 1; round <= ROUNDS; round++)); do
  echo "round $round of $ROUNDS: gloo fp32, loco fp32, loco uint8, loco int8-block" >&2
  for kind in "${KINDS[@]}"; do
    run_once "$kind" "$i"
    i=$((i + 1))
  done
done
memcpy=$("$LOCO" bench codec --codec fp32 --threads 1 --repeats 3 --json)

python3 - "$TMP" "$((${#KINDS[@]} * ROUNDS))" "$WORLD" "$ELEMENTS" "$RATE" "$(nproc)" "$BACKGROUND" \
  "$memcpy" "$FLOW" <<'PY'
import json, os, statistics, sys
tmp, runs, world, n, rate, cores, background = sys.argv[1], *map(int, sys.argv[2:8])
memcpy = json.loads(sys.argv[8])["memcpy_gbps"]
flow = json.loads(sys.argv[9])
names = {"gloo": "torch gloo fp32", "fp32": "loco ring fp32", "uint8": "loco ring uint8",
         "int8-block": "loco ring int8-block"}
order = list(names)
pool = {k: {"reps": [], "cpu": [], "bytes": [], "drops": 0, "err": [], "same": True, "frames": []}
        for k in order}
for i in range(runs):
    kind, drops, frames = open(os.path.join(tmp, f"run{i}.meta")).read().split()
    ranks = []
    for r in range(world):
        lines = [l for l in open(os.path.join(tmp, f"run{i}.rank{r}.json")) if l.startswith("{")]
        ranks.append(json.loads(lines[-1]))
    reps = len(ranks[0]["seconds"])
    p = pool[kind]
    # A repetition takes as long as its slowest rank; CPU: the median over repetitions of the
    # mean over ranks.
    p["reps"] += [max(x["seconds"][j] for x in ranks) for j in range(reps)]
    p["cpu"].append(statistics.median(
        sum(x["cpu_seconds"][j] for x in ranks) / world for j in range(reps)))
    p["drops"] += int(drops)
    if kind == "gloo":
        p["bytes"].append(2 * (world - 1) / world * 4 * n)
    else:
        p["bytes"].append(max(x["body_bytes_sent"] for x in ranks))
        p["err"].append(ranks[0]["rel_rms_error"])
        p["same"] &= len({x["result_hash"] for x in ranks}) == 1
    # Frame bytes one rank put on its upload in one all-reduce: every frame passes two qdiscs
    # (its sender's upload and its receiver's download); the run's warm-up and barriers are
    # small beside the timed all-reduces.
    p["frames"].append(int(frames) / 2 / world / reps / p["bytes"][-1])
fig = {}
for k in order:
    p = pool[k]
    best, med = min(p["reps"]), statistics.median(p["reps"])
    b = max(p["bytes"])
    fig[k] = dict(best=best, med=med, cpu=statistics.median(p["cpu"]), bytes=b,
                  gp=b * 8 / best / 1e6, gp_med=b * 8 / med / 1e6, count=len(p["reps"]))
g = fig["gloo"]
print(f"all-reduce of {n} float32 ({n * 4 / 1e6:.0f} MB) per rank, {world} ranks, one network "
      f"namespace each, links shaped to {rate} Mbit/s each way (tbf); {g['count']} repetitions "
      f"each in {runs // len(order)} round(s)")
print(f"shaping, one TCP flow rank 0 -> rank 1: payload {flow['bytes'] * 8 / flow['seconds'] / 1e6:.0f} "
      f"Mbit/s ({100 * flow['bytes'] * 8 / flow['seconds'] / 1e6 / rate:.1f}% of {rate}; "
      f"ceiling 1448/1514 = 95.6%), frames {flow['qdisc_bytes'] * 8 / flow['seconds'] / 1e6:.0f} "
      f"Mbit/s as the qdisc counts them")
print(f"this machine: {cores} cores, memcpy on one core {memcpy:.1f} GB/s; before the runs "
      f"{background}% of its cores were busy with other work"
      + (" (the ranks had less CPU than the cores)" if background >= 10 else ""))
if world > cores:
    print(f"WARNING: {world} ranks share {cores} cores: a rank has {cores / world:.2f} of a core "
          f"on average, so CPU time per rank counts beside wall time (CPU/wall near "
          f"{cores / world:.2f} = the ranks are CPU-bound, not link-bound)")
print("goodput: bytes one rank sends in one all-reduce (gloo: ring formula 2(W-1)/W x 4N; loco: "
      "its bytes_sent_per_rank) / the all-reduce's time, against the link rate; from the best "
      "and the median repetition")
hdr = (f"{'implementation':<22}{'best s':>8}{'x gloo':>8}{'median s':>10}{'x gloo':>8}"
       f"{'CPU/rank s':>12}{'CPU/wall':>10}{'MB/rank':>9}{'goodput Mbit/s':>16}{'% link':>8}"
       f"{'% link med':>12}")
print(hdr)
for k in order:
    f = fig[k]
    print(f"{names[k]:<22}{f['best']:>8.3f}{f['best'] / g['best']:>8.2f}{f['med']:>10.3f}"
          f"{f['med'] / g['med']:>8.2f}{f['cpu']:>12.3f}{f['cpu'] / f['med']:>10.2f}"
          f"{f['bytes'] / 1e6:>9.1f}{f['gp']:>16.0f}{100 * f['gp'] / rate:>8.1f}"
          f"{100 * f['gp_med'] / rate:>12.1f}")
for k in order:
    p = pool[k]
    extra = ""
    if p["err"]:
        extra = (f", rel. RMS error {100 * max(p['err']):.3f}%, replicas identical "
                 f"{'yes' if p['same'] else 'NO'}")
    wire = statistics.median(p["frames"])
    print(f"  {names[k]}: {wire:.4f} frame bytes on the links per byte sent (TCP/IP and Ethernet "
          f"headers, the other direction's ACKs; goodput ceiling {100 / wire:.1f}%), "
          f"{p['drops']} packets dropped by the qdiscs{extra}")
setting = (world, n, rate) == (4, 25_000_000, 1000)
for k, target in [("uint8", 0.30), ("fp32", 1.05)]:
    r = fig[k]["best"] / g["best"]
    print(f"target: {names[k]} at most {target:.2f}x gloo fp32's time (best repetitions): "
          f"{r:.2f}x (medians {fig[k]['med'] / g['med']:.2f}x), {'met' if r <= target else 'NOT met'}")
for k in ["fp32", "uint8", "int8-block"]:
    pc = 100 * fig[k]["gp"] / rate
    print(f"target: {names[k]} goodput at least 90% of the link rate (best repetition): "
          f"{pc:.1f}%, {'met' if pc >= 90 else 'NOT met'}")
if not setting:
    print("(the targets are for 4 ranks, 25000000 values and 1000 Mbit/s)")
PY
