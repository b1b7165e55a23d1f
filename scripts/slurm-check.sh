#!/usr/bin/env bash
# Runs examples/slurm/accelbench-multinode.sbatch's launch path under a real Slurm on this one
# machine, CPU only: installs Slurm and MUNGE (Debian packages), starts a private single-node
# cluster (its slurm.conf and state under a temporary folder, named by SLURM_CONF), submits a
# variant of the example that differs only in size (1 node, 2 tasks, no GPUs, the CPU device and
# a tiny model) with `sbatch --wait`, checks that rank 0 wrote the records and that the 2-task
# training point carries its scaling efficiency, and stops the daemons. Needs root (the daemons).
#   usage: scripts/slurm-check.sh [accelbench binary, default build/cpu/src/cli/accelbench]
set -euo pipefail
cd "$(dirname "$0")/.."
ab=$(realpath "${1:-build/cpu/src/cli/accelbench}")
[[ -x $ab ]] || { echo "no accelbench at $ab: build the cpu preset first"; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "run as root: it starts slurmctld, slurmd and munged"; exit 1; }
command -v slurmctld >/dev/null && command -v munged >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null

work=$(mktemp -d)
export SLURM_CONF=$work/slurm.conf
host=$(hostname -s)
cpus=$(nproc)
mkdir -p "$work/spool" "$work/state" /run/munge /etc/munge
[[ -f /etc/munge/munge.key ]] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
chown -R munge:munge /etc/munge /run/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || munged --force
cat > "$SLURM_CONF" <<EOF
ClusterName=accelbench-check
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmdSpoolDir=$work/spool
StateSaveLocation=$work/state
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
stop() {  # this cluster's controller and node daemon (SLURM_CONF names it)
  scancel --quiet --user=root 2>/dev/null || true
  scontrol shutdown 2>/dev/null || true
}
trap stop EXIT
slurmctld
slurmd
for _ in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo

# The example, sized for this machine: the same #SBATCH lines but one node of two tasks and no
# GPUs, the same srun flags, the CPU device and a tiny model in place of the GPU workloads.
sed -e 's/^#SBATCH --nodes=2/#SBATCH --nodes=1/' -e 's/^#SBATCH --ntasks-per-node=8/#SBATCH --ntasks-per-node=2/' \
  -e '/^#SBATCH --gpus-per-node/d' -e '/^#SBATCH --exclusive/d' \
  -e 's|accelbench run collectives --axis bytes=8:8589934592:pow2|accelbench run collectives --device cpu --axis bytes=8:1024:pow2|' \
  -e 's|accelbench run train --axis model=resnet50 --axis precision=bf16 \\|accelbench run train --device cpu --axis model=tiny_resnet --axis image_size=8 --option trajectory_steps=2 --axis graph=off --min-time 0.05 \\|' \
  -e 's|  --axis batch=256 --axis gpus=1,8,16 --out "$OUT"|  --axis batch=4 --axis gpus=1,2 --out "$OUT"|' \
  examples/slurm/accelbench-multinode.sbatch > "$work/check.sbatch"
grep -q -- 'gpus=1,2 ' "$work/check.sbatch" || { echo "the example changed: update this script's substitutions"; exit 1; }
(cd "$work" && PATH=$(dirname "$ab"):$PATH sbatch --wait check.sbatch)
cat "$work"/accelbench-*.log | tail -n 8
python3 - "$work/accelbench-results" <<'PY'
import glob, json, sys
points = [json.loads(l) for f in glob.glob(sys.argv[1] + "/runs/*/points.jsonl") for l in open(f)]
train = [p for p in points if p["workload"] == "train"]
two = [p for p in train if p["params"]["gpus"] == 2]
assert len(train) == 2 and all(p["status"] == "ok" for p in train), [p["status"] for p in train]
assert two[0]["context"]["dist"]["launcher"] == "slurm", two[0]["context"]["dist"]
assert two[0]["metrics"]["scaling_efficiency"] > 0
print("slurm check: ok (launcher slurm, %d processes, scaling efficiency %.3f)"
      % (two[0]["context"]["dist"]["processes"], two[0]["metrics"]["scaling_efficiency"]))
PY
