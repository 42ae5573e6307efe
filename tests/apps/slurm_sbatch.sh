#!/usr/bin/env bash
# slurm_sbatch.sh BUILD_DIR WORK_DIR SOURCE_DIR: runs scripts/slurm/train_resnet.sbatch as a Slurm job
# would (SLURM_* set, the script's own settings from the environment) without Slurm: stand-ins for
# `scontrol show hostnames` (this host) and `srun` (ringtrain_run's host probe: runs the command), and
# Open MPI told not to use its Slurm launcher. Proves the command line the script builds (ringtrain_run
# around train_resnet) is valid and that a second submission resumes from the checkpoint, on any machine;
# cluster.slurm_* run it under real Slurm.
set -euo pipefail
build=$1; work=$2; src=$3
rm -rf "$work"; mkdir -p "$work/bin"
cat > "$work/bin/srun" <<'SH'
#!/usr/bin/env bash
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
exec "$@"
SH
cat > "$work/bin/scontrol" <<'SH'
#!/usr/bin/env bash
[[ $1 == show && $2 == hostnames ]] && { hostname; exit 0; }
echo "scontrol stand-in: only 'show hostnames'" >&2; exit 1
SH
chmod +x "$work/bin/srun" "$work/bin/scontrol"
run() {
  (cd "$work" && PATH="$work/bin:$PATH" OMPI_MCA_plm=^slurm OMPI_MCA_ras=^slurm OMPI_ALLOW_RUN_AS_ROOT=1 \
     OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 SLURM_NTASKS_PER_NODE=2 \
     SLURM_SUBMIT_DIR="$work" SLURM_JOB_ID=42 SLURM_NTASKS=2 SLURM_JOB_NUM_NODES=1 \
     SLURM_JOB_NODELIST=localhost RINGTRAIN_BUILD="$build" ARCH=resnet20 BATCH=8 EPOCHS=1 WARMUP_EPOCHS=0 \
     EXTRA="--steps $1 --image-size 16 --threads 1 --synthetic-size 64" bash "$src/scripts/slurm/train_resnet.sbatch")
}
run 2
test -f "$work/runs/42/ckpt-step00000002.h5"
run 4 | tee "$work/second.log"
grep -q "resumed from .*ckpt-step00000002.h5: step 2" "$work/second.log"
test -f "$work/runs/42/ckpt-step00000004.h5"
echo "sbatch script ran and resumed"
