#!/bin/bash
# Every figure of docs/benchmarks.md's GPU section, in one call of the device tool (under 10 minutes):
#
#     ../shared/gpu/prepare.sh                 # here: .gpu/ with the wheels the image lacks and this tree's
#     device run: bash bench/gpu.sh            # carry [".gpu"], timeout_s 600
#
# A session is lent a GPU for 15 minutes at most, starts included, so this runs what #44 asks
# for in one go: the CUDA tests, the whole nanoGPT job under plain torchrun and under ddptop, the
# example's in-rank bench and its whole job at both widths, then nanoGPT's loop in one process,
# the cost of each op the guard launches, and the example under gradient_as_bucket_view (the
# guard's norm a bucket at a time) beside the floor's norm as one CUDA graph (inrank.py
# --graph-floor: under bucket views the gradients do not move, so it should replay at every
# step, where 096e540's lease saw it replay a third of the steps in DDP's default layout). The
# parts run most needed first; one that might not end within BUDGET_S of the call's start is
# left out (the last ones, most likely), for a second call to run (ONLY names its parts). Each
# job's host time by op (inrank.py --torch-profile, about 40 s a loop) is left to a second call:
# the lease of 464cd8e ran it, docs/benchmarks.md has it. ../shared/gpu/check.sh runs the tests
# and the example's benches alone, and a second tree beside this one; this adds the nanoGPT job,
# its loop and the op costs, and leaves the second tree out.
#
# It installs .gpu/whl into the image's Python and runs every part from /tmp, the wheel and not
# the checkout being what imports (inside the checkout, `ddptop` would be its folder). Each part
# has its own time limit (timeout stops the whole process group: a bench's ranks too), and the
# logs are packed into $OUT/gpu-logs.tgz after each, so a call cut short still returns what ran.
set -u
export PYTHONUNBUFFERED=1 DDPTOP_HOME=/tmp/ddptop-home
root=$(pwd)
logs=/tmp/gpu-logs
mkdir -p "$logs"

pack() { tar -czf "$OUT/gpu-logs.tgz" -C /tmp gpu-logs 2>/dev/null; }

BUDGET_S=${BUDGET_S:-575}  # the device's run stops the whole call at 600 s: a part that might not end by then is left out

ONLY=${ONLY:-}  # the parts to run, by log name ("overhead-4096 opcost"): a second call's; all when empty

part() {  # seconds, the log's name, then the command
    local limit=$1 name=$2
    shift 2
    if [[ -n $ONLY && " $ONLY " != *" $name "* ]]; then
        return
    fi
    if (( SECONDS + limit > BUDGET_S )); then
        echo "== $name left out: at ${SECONDS} s its ${limit} s would pass ${BUDGET_S} s" | tee "$logs/$name.txt"
        return
    fi
    echo "== $name (at most ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" > "$logs/$name.txt" 2>&1
    echo "exit $?" >> "$logs/$name.txt"
    tail -n 30 "$logs/$name.txt"
    pack
}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .gpu/whl/*.whl > "$logs/install.txt" 2>&1 \
    || { cat "$logs/install.txt"; exit 1; }
# The host's topology too: whole jobs vary between processes by more than ddptop costs them
# (docs/benchmarks.md), and a rank's training and autograd threads on two threads of one core
# would be one cause, which `taskset` round the bench can rule out on the next lease.
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"; lscpu | grep -E '^(Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node)'; } \
    | tee "$logs/env.txt"
# Whether this torch's NCCL flight recorder records without the variable ddptop sets: if it does,
# plain torchrun pays for it too, and the recorder is no part of ddptop's cost here.
timeout 30 python3 - <<'EOF' 2>&1 | tail -n 1 | tee -a "$logs/env.txt"
import os, pickle, torch, torch.distributed as dist
for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
    os.environ.pop(name, None)
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
dist.all_reduce(torch.ones(4, device="cuda"))
torch.cuda.synchronize()
entries = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace()).get("entries", [])
print(f"the NCCL flight recorder, its variables unset: {len(entries)} entries after one all_reduce")
dist.destroy_process_group()
EOF
pack
cd /tmp
part 140 pytest-cuda python3 -m pytest -m cuda "$root/tests" --rootdir "$root" -c "$root/pyproject.toml" -p no:cacheprovider -rA -q
part 150 nanogpt python3 "$root/bench/nanogpt.py" --ranks 1 --rounds 3 --iters 300
part 45 inrank-mlp python3 "$root/bench/inrank.py" --floor --blocks 200 --lines
part 110 overhead-256 python3 "$root/bench/overhead.py" --ranks 1 --steps 1500 --rounds 2
part 85 overhead-4096 python3 "$root/bench/overhead.py" --ranks 1 --steps 600 --rounds 2 --width 4096 --batch-size 512
part 115 inrank-gpt python3 "$root/bench/inrank.py" --model gpt --floor --blocks 100 --lines
part 30 opcost python3 "$root/bench/opcost.py" --calls 10000
# #82: an FSDP2 step on the GPU beside its shard floor, and the floor plus one all-reduce of its
# non-finite flag on NCCL (what keeping a non-finite sharded step from the weights costs at least;
# 0.9 ms a step on gloo). One rank: a mesh of one, whose collectives NCCL still runs.
part 70 inrank-fsdp2 python3 "$root/bench/inrank.py" --model fsdp2 --floor --agree --blocks 100
part 60 inrank-mlp-bucket-view python3 "$root/bench/inrank.py" --floor --graph-floor --bucket-view --blocks 150 --lines
